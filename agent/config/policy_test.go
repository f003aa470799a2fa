package config

import (
	"slices"
	"strings"
	"testing"
)

// TestTrustKeyRepeats: --trust-key given several times trusts every key
// named; the flags together replace the variable's list, as any flag wins
// over its variable.
func TestTrustKeyRepeats(t *testing.T) {
	env := map[string]string{EnvPrefix + "TRUST_KEY": "/etc/env.pub"}
	getenv := func(k string) string { return env[k] }
	cfg, err := Load([]string{"--trust-key", "/a.pub", "--allow-source", "signed", "--trust-key", "/b.pub,/keys"}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/a.pub", "/b.pub", "/keys"}; !slices.Equal(cfg.TrustKeys, want) {
		t.Errorf("trust keys %v, want %v", cfg.TrustKeys, want)
	}
	if cfg, _ := Load(nil, getenv); !slices.Equal(cfg.TrustKeys, []string{"/etc/env.pub"}) {
		t.Errorf("trust keys from the variable: %v", cfg.TrustKeys)
	}
	if _, err := Load([]string{"--allow-source", "unsigned"}, getenv); err == nil {
		t.Error("--allow-source unsigned accepted")
	}
}

// TestAllowEnvRepeatsAndWarns: --allow-env given several times allows
// every pattern; one that lets a call set a variable known to load code,
// or one given without a code policy, is warned about at start.
func TestAllowEnvRepeatsAndWarns(t *testing.T) {
	getenv := func(string) string { return "" }
	cfg, err := Load([]string{"--allow-module", "acme.*", "--allow-env", "WANDB_*", "--allow-env", "SEED,LD_*"}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"WANDB_*", "SEED", "LD_*"}; !slices.Equal(cfg.AllowEnv, want) {
		t.Errorf("allow-env %v, want %v", cfg.AllowEnv, want)
	}
	if err := cfg.resolvePolicy(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "--allow-env LD_* lets a call set LD_PRELOAD") {
		t.Errorf("warnings: %q", cfg.Warnings)
	}
	if no := cfg.Policy.CheckEnv([]string{"WANDB_MODE=offline", "SEED=3"}, ""); no != nil {
		t.Errorf("allowed env refused: %v", no)
	}
	off, _ := Load([]string{"--allow-env", "SEED"}, getenv)
	if err := off.resolvePolicy(); err != nil || len(off.Warnings) != 1 || !strings.Contains(off.Warnings[0], "no code policy is on") {
		t.Errorf("--allow-env without a policy: %v %q", err, off.Warnings)
	}
	bad, _ := Load([]string{"--allow-module", "acme.*", "--allow-env", "A=B"}, getenv)
	if err := bad.resolvePolicy(); err == nil || !strings.Contains(err.Error(), "--allow-env A=B") {
		t.Errorf("--allow-env A=B: %v", err)
	}
}
