package config

import (
	"slices"
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
