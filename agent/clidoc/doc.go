// Package clidoc writes the command line's other documentation: the manual
// page fluksio-worker(1) and the bash, zsh and fish completions. Both are
// generated from what drives --help, so neither can drift from it: the
// command list (package main's), each command's own --help text, and the options
// table of run (config.Options) with each option's variable and config key.
//
// Nothing here lists a command or an option by hand. A new option in the
// table, a new command in the list, or a new flag in a command's help shows
// up in the manual and the completions at the next build.
package clidoc

import (
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// CLI is the whole command line, as main wires it.
type CLI struct {
	Program  string    // fluksio-worker
	Version  string    // stamped by the release build; "dev" otherwise
	Date     time.Time // the manual's date (the commit's, for a release)
	Tagline  string    // what the program does, in a few words, lower case
	About    string    // the paragraph that opens --help
	Synopsis []string  // the forms of the command line, without the program name
	// Examples are the quick start of --help: a command line and what it
	// does.
	Examples [][2]string
	Commands []Command
	// TableCommand is the command whose options are config.Options (run):
	// the manual lists them once, under OPTIONS, with their variables and
	// config keys, rather than again in that command's section.
	TableCommand string
	Options      []config.Option
	// Environment is every other variable the program reads, and what it
	// does: the manual's ENVIRONMENT lists them after the options'.
	Environment [][2]string
}

// Command is one command of the list.
type Command struct {
	Name    string
	Summary string
	Help    string // what `PROGRAM NAME --help` prints
	// TakesTable: besides the flags its help shows, the command takes every
	// option of the table (check says so in one line), so completions
	// offer them all.
	TakesTable bool
}
