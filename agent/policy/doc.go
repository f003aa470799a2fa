// Package policy is the machine owner's say over what a call may run,
// whatever the engine sends: which installed modules a module node may name
// (--allow-module), whether shipped source runs at all, only when signed by
// a trusted key, or always (--allow-source), and, once a code policy is
// on, which environment variables a call may set (those that only tune,
// and --allow-env's). It also holds the signature format of node source
// (SIGNING.md) and its keys.
//
// Everything here is decided from the request alone, before a call takes a
// slot, so a refusal costs no process.
package policy
