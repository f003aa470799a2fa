// Package config owns how the worker is configured: the options table
// (Options, one entry per option of run, with its flag, environment
// variable, config-file key, check and help), loading it from flags, the
// environment and a TOML file (Load, ApplyFile), token files, the engine
// URL (CompleteURL), TLS trust (--ca-file), the private state directory
// (ResolveStateDir), usage errors, the help-text layout (WriteOption), how
// every command reads its command line (Command: --help, a mistyped option,
// a stray argument) and the exit codes of every command (exit.go).
package config
