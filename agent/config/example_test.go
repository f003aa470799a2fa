package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestConfigExample: the example config the packages install shows every
// option of the table (commented out), no token, and is a valid config
// once uncommented.
func TestConfigExample(t *testing.T) {
	path := filepath.Join("..", "..", "packaging", "config.example.toml")
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`(?m)^#?\s*token\s*=`).Match(text) {
		t.Error("the example config shows a token key; it must point at token-file instead")
	}
	setting := regexp.MustCompile(`^# ([a-z-]+) = (.*)$`)
	var uncommented strings.Builder
	shown := map[string]bool{}
	for _, line := range strings.Split(string(text), "\n") {
		if m := setting.FindStringSubmatch(line); m != nil {
			shown[m[1]] = true
			line = m[1] + " = " + m[2]
		}
		uncommented.WriteString(line + "\n")
	}
	for _, o := range Options {
		if o.Name != "token" && !shown[o.Name] {
			t.Errorf("packaging/config.example.toml does not show %q (%s)", o.Name, o.Help)
		}
	}
	tmp := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(tmp, []byte(uncommented.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	if err := ApplyFile(&cfg, tmp); err != nil {
		t.Errorf("the example, uncommented, is not a valid config: %v", err)
	}
}
