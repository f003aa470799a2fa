package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// Command is one command's command line: its name, its --help and its
// flags (the embedded flag set). Every command of the binary parses
// through one, so that --help, a mistyped option and a stray argument are
// answered alike by all of them: each command says only its name, its
// help, its flags and what it does.
type Command struct {
	*flag.FlagSet
	help func(io.Writer)

	// Operands says the command takes arguments besides its options
	// (copy's DIR, sign's files) and checks them itself; otherwise Parse
	// refuses any.
	Operands bool
}

// NewCommand is `fluksio-worker name`, whose --help help writes.
func NewCommand(name string, help func(io.Writer)) *Command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package's own messages are not shown: Parse says each
	// error once, in this binary's words.
	fs.SetOutput(io.Discard)
	return &Command{FlagSet: fs, help: help}
}

// HelpText is a help that is fixed text.
func HelpText(text string) func(io.Writer) {
	return func(w io.Writer) { fmt.Fprint(w, text) }
}

// Parse reads args into the command's flags. Its error is flag.ErrHelp
// for -h, -help or --help, else a *UsageError that says what is wrong as
// the user typed it ("unknown option --urll; did you mean --url?") and
// points at the command's --help. Answer says either.
func (c *Command) Parse(args []string) error {
	if err := c.FlagSet.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return Usagef("%v (see 'fluksio-worker %s --help')", FlagError(c.FlagSet, args, err), c.Name())
	}
	if !c.Operands && c.NArg() > 0 {
		return Usagef("unexpected argument %q (see 'fluksio-worker %s --help')", c.Arg(0), c.Name())
	}
	return nil
}

// Answer ends a command whose command line was not one to act on (Parse's
// error, or a usage error of the command's own) and returns its exit
// status: the help on stdout and 0 when it was asked for, else the error
// on stderr and ExitUsage.
func (c *Command) Answer(err error, stdout, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		c.help(stdout)
		return ExitOK
	}
	fmt.Fprintf(stderr, "fluksio-worker: %v\n", err)
	return ExitUsage
}

// Given reports whether the flag name was on the command line, as opposed
// to holding its default.
func (c *Command) Given(name string) bool {
	given := false
	c.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
