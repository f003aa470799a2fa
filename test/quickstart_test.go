package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The README's Quick start, from a clean clone, as a newcomer types it: no
// command assumes sudo (a root shell has none); `go run . selftest` runs and
// passes; the suite's command names a script the clone has, which bash can
// read (the suite itself is what runs this test, so it is not run again
// here). A command this test does not know fails it, so a new one gets
// checked too.
func TestQuickStartFromAClone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the worker in a fresh clone (a minute or two)")
	}
	root := moduleRoot(t)
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skip("not a git checkout: nothing to clone")
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	commands := quickStartCommands(t, string(readme))

	clone := filepath.Join(t.TempDir(), "clone")
	// safe.directory: a checkout owned by another user (CI's, cloned by
	// root) is still what this test means to clone.
	if out, err := exec.Command("git", "-c", "safe.directory=*", "clone", "--quiet", "--no-hardlinks", root, clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone %s: %v\n%s", root, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, command := range commands {
		if strings.HasPrefix(command, "sudo ") {
			t.Errorf("the Quick start's %q assumes sudo, which a root shell does not have", command)
			continue
		}
		switch command {
		case "go run . selftest":
			cmd := exec.CommandContext(ctx, "go", "run", ".", "selftest")
			cmd.Dir = clone
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "selftest passed") {
				t.Errorf("%s in a fresh clone: %v\n%s", command, err, out)
			}
		case "bash test/all.sh":
			if out, err := exec.Command("bash", "-n", filepath.Join(clone, "test", "all.sh")).CombinedOutput(); err != nil {
				t.Errorf("%s: the clone's script does not parse: %v\n%s", command, err, out)
			}
		default:
			t.Errorf("the Quick start runs %q, which this test does not check: add it here", command)
		}
	}
}

// quickStartCommands returns the commands of the first sh block under the
// README's "## Quick start", comments and blank lines left out.
func quickStartCommands(t *testing.T, readme string) []string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## Quick start\n")
	if !ok {
		t.Fatal(`README.md has no "## Quick start" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal("README.md's Quick start has no ```sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	var commands []string
	for _, line := range strings.Split(block, "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			commands = append(commands, line)
		}
	}
	if len(commands) == 0 {
		t.Fatal("README.md's Quick start block has no command")
	}
	return commands
}
