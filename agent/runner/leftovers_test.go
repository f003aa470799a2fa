package runner

import (
	"os"
	"path/filepath"
	"testing"
)

// TestClearLeftoversKeepsTheCaches: what a killed worker's calls left (a
// call directory, a partial artifact, a partial code-cache entry) goes;
// complete cache entries stay.
func TestClearLeftoversKeepsTheCaches(t *testing.T) {
	state := t.TempDir()
	write := func(rel string) string {
		path := filepath.Join(state, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	gone := []string{
		write("calls/call-123/checkpoint.pt"),
		write("artifacts/sha256/.part-abc"),
		write("artifacts/code/.part-def"),
	}
	kept := []string{
		write("artifacts/sha256/0123abcd"),
		write("artifacts/code/a7b3-0-1234-56"),
	}
	n, err := ClearLeftovers(state)
	if err != nil || n != 3 {
		t.Fatalf("ClearLeftovers = %d, %v; want 3 removed", n, err)
	}
	for _, p := range gone {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there", p)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}
