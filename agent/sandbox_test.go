package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// A token mounted from a Kubernetes Secret is a link through ..data to a
// timestamped directory the kubelet swaps when the Secret is rotated:
// the sandbox hides the volume's directory, not only the file of the
// moment. A plain token file hides itself alone (its directory may be a
// person's home).
func TestSandboxHidesARotatableSecretsDirectory(t *testing.T) {
	secret := t.TempDir()
	stamp := filepath.Join(secret, "..2026_12_05_21_00_00.123")
	if err := os.Mkdir(stamp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stamp, "token"), []byte("t0ken-of-the-moment"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(stamp), filepath.Join(secret, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "token"), filepath.Join(secret, "token")); err != nil {
		t.Fatal(err)
	}
	plainDir := t.TempDir()
	plain := filepath.Join(plainDir, "token")
	if err := os.WriteFile(plain, []byte("t0ken"), 0o600); err != nil {
		t.Fatal(err)
	}

	sb := SandboxOf(config.Config{TokenFile: filepath.Join(secret, "token")}, "/bin/true", "/state")
	if !slices.Contains(sb.Hide, secret) {
		t.Errorf("a Secret's token: hidden %v, want its volume %s hidden too", sb.Hide, secret)
	}
	sb = SandboxOf(config.Config{TokenFile: plain}, "/bin/true", "/state")
	if slices.Contains(sb.Hide, plainDir) || !slices.Contains(sb.Hide, plain) {
		t.Errorf("a plain token file: hidden %v, want %s alone", sb.Hide, plain)
	}
}
