package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/platform"
)

// copyCommand copies this binary into a directory: the worker's image holds
// nothing but the binary (no shell, no cp), so an init container runs
// `/fluksio-worker copy /fluksio/bin` to put the worker into an emptyDir the
// main container (the user's own image) then runs it from.
func copyCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	const usage = `Usage: fluksio-worker copy DIR

Copies this binary to DIR/fluksio-worker (mode 0755), replacing any file
there. For an init container that puts the worker into another image through
a shared volume; the worker image has no shell to run cp with. DIR must
exist (the volume's mount point): a mistyped path fails instead of copying
into the init container's own file system.
Exit status: 0 copied, 1 DIR missing or not writable, 2 bad options.
`
	cmd := config.NewCommand("copy", config.HelpText(usage))
	cmd.Operands = true // DIR
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	if cmd.NArg() != 1 {
		fmt.Fprint(stderr, usage)
		return config.ExitUsage
	}
	dst, err := copySelf(cmd.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker copy: %v\n", err)
		return config.ExitFailed
	}
	fmt.Fprintf(stdout, "copied fluksio-worker %s to %s\n", version, dst)
	return config.ExitOK
}

// copySelf writes the running executable to dir/fluksio-worker atomically,
// so a reader never sees half a binary.
func copySelf(dir string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	src, err := os.Open(exe)
	if err != nil {
		return "", err
	}
	defer src.Close()
	// Not created: a typo in the mount path would "succeed" into the
	// container's own file system, which nothing else sees.
	if st, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("%s does not exist: give the directory the shared volume is mounted on (copy does not create it): %w", dir, err)
	} else if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory: give the directory the shared volume is mounted on", dir)
	}
	dst := filepath.Join(dir, "fluksio-worker")
	return dst, platform.CopyFileAtomic(dst, src, 0o755, platform.KeepOwner)
}
