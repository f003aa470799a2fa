package installer

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// parseFlags parses a command's flags. It returns errHelp for -h/--help
// and a message that points at --help for anything else wrong.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return fmt.Errorf("%v (see 'fluksio-worker %s --help')", config.FlagError(fs, args, err), fs.Name())
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see 'fluksio-worker %s --help')", fs.Arg(0), fs.Name())
	}
	return nil
}

var errHelp = flag.ErrHelp

// flagGiven says whether a flag was on the command line (as opposed to
// holding its default).
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			given = true
		}
	})
	return given
}

// usageExit prints a flag error and returns the usage exit code, or prints
// the help and returns 0.
func usageExit(err error, help func(io.Writer), stdout, stderr io.Writer) int {
	if errors.Is(err, errHelp) {
		help(stdout)
		return config.ExitOK
	}
	fmt.Fprintf(stderr, "fluksio-worker: %v\n", err)
	return config.ExitUsage
}
