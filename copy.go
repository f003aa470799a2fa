package main

import (
	"context"
	"errors"
	"flag"
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
a shared volume; the worker image has no shell to run cp with.
`
	fs := flag.NewFlagSet("copy", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			// Asked for: on stdout, exit 0 (the manual and completions read it).
			fmt.Fprint(stdout, usage)
			return config.ExitOK
		}
		fmt.Fprintf(stderr, "fluksio-worker copy: %v\n\n%s", err, usage)
		return config.ExitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprint(stderr, usage)
		return config.ExitUsage
	}
	dst, err := copySelf(fs.Arg(0))
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
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "fluksio-worker")
	return dst, platform.CopyFileAtomic(dst, src, 0o755, platform.KeepOwner)
}
