package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/policy"
)

// TestKeygenAndSignCommands: keygen writes a key pair, sign adds a
// signature line a worker trusting the public key accepts, signing again
// replaces it, and an expiry in the past is refused by the worker.
func TestKeygenAndSignCommands(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "ci-key")
	var out, errs bytes.Buffer
	if code := dispatch(context.Background(), []string{"keygen", "--out", key}, &out, &errs); code != config.ExitOK {
		t.Fatalf("keygen: exit %d: %s", code, errs.String())
	}
	if code := dispatch(context.Background(), []string{"keygen", "--out", key}, &out, &errs); code != config.ExitFailed || !strings.Contains(errs.String(), "never overwritten") {
		t.Errorf("keygen over an existing key: exit %d: %s", code, errs.String())
	}
	node := filepath.Join(dir, "train.py")
	src := "from fluksio import node\n\n@node()\ndef train():\n    return 1\n"
	if err := os.WriteFile(node, []byte(src), 0o640); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if code := dispatch(context.Background(), []string{"sign", "--key", key, "--expires", "90d", node}, &out, &errs); code != config.ExitOK {
			t.Fatalf("sign: exit %d: %s", code, errs.String())
		}
	}
	signed, _ := os.ReadFile(node)
	if !strings.HasPrefix(string(signed), src) || strings.Count(string(signed), "# fluksio-signature: v1 key=") != 1 {
		t.Errorf("the signed file:\n%s", signed)
	}
	if st, _ := os.Stat(node); st.Mode().Perm() != 0o640 {
		t.Errorf("signing changed the file's mode to %v", st.Mode())
	}
	ring, err := policy.LoadKeyRing([]string{key + policy.PublicKeySuffix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ring.Verify(signed, time.Now()); err != nil {
		t.Errorf("the worker refuses what sign signed: %v", err)
	}
	if _, err := ring.Verify(signed, time.Now().AddDate(0, 0, 91)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("a signature past --expires: %v", err)
	}
	errs.Reset()
	if code := dispatch(context.Background(), []string{"sign", "--key", key + policy.PublicKeySuffix, node}, &out, &errs); code != config.ExitFailed || !strings.Contains(errs.String(), "public key") {
		t.Errorf("sign with the public key: exit %d: %s", code, errs.String())
	}
}

func TestSignExpiry(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Time{
		"90d":                  now.AddDate(0, 0, 90),
		"36h":                  now.Add(36 * time.Hour),
		"2027-01-31":           time.Date(2027, 1, 31, 23, 59, 59, 0, time.UTC),
		"2027-01-31T10:00:00Z": time.Date(2027, 1, 31, 10, 0, 0, 0, time.UTC),
	} {
		if got, err := parseExpiry(v, now); err != nil || !got.Equal(want) {
			t.Errorf("--expires %s: %v %v, want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"soon", "-3d", "0", "2026-12-03", "2026-12-04T11:59:59Z", "2020-01-01"} {
		if _, err := parseExpiry(v, now); err == nil {
			t.Errorf("--expires %s accepted", v)
		}
	}
}

// sign --expires with a time already past signs nothing and says so: the
// signature would be refused by every worker at once.
func TestSignRefusesAnExpiryInThePast(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "ci-key")
	var out, errs bytes.Buffer
	if code := dispatch(context.Background(), []string{"keygen", "--out", key}, &out, &errs); code != config.ExitOK {
		t.Fatalf("keygen: exit %d: %s", code, errs.String())
	}
	node := filepath.Join(dir, "train.py")
	os.WriteFile(node, []byte("x = 1\n"), 0o640)
	errs.Reset()
	code := dispatch(context.Background(), []string{"sign", "--key", key, "--expires", "2020-01-31", node}, &out, &errs)
	if code != config.ExitUsage || !strings.Contains(errs.String(), "in the past") || !strings.Contains(errs.String(), "90d") {
		t.Errorf("sign --expires 2020-01-31: exit %d: %s; want 2, saying it is in the past and what to give", code, errs.String())
	}
	if b, _ := os.ReadFile(node); string(b) != "x = 1\n" {
		t.Errorf("a refused sign changed the file:\n%s", b)
	}
}

// One duration syntax across the binary: what sign --expires takes as a
// duration, every duration option takes, days included.
func TestOneDurationSyntax(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, v := range []string{"90d", "1.5d", "720h", "300", "5m"} {
		expires, err := parseExpiry(v, now)
		if err != nil {
			t.Errorf("sign --expires %s: %v", v, err)
			continue
		}
		o, _ := config.OptionByName("health-grace")
		if err := o.Check(v); err != nil {
			t.Errorf("sign --expires takes %s (%s from now) but --health-grace refuses it: %v", v, expires.Sub(now), err)
		}
	}
}
