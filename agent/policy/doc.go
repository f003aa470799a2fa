// Package policy is the machine owner's say over what a call may run,
// whatever the engine sends: which installed modules a module node may name
// (--allow-module), whether shipped source runs at all, only when signed by
// a trusted key, or always (--allow-source), and which of a call's
// environment variables could load other code and are refused once a code
// policy is on. It also holds the signature format of node source
// (SIGNING.md) and its keys.
//
// Everything here is decided from the request alone, before a call takes a
// slot, so a refusal costs no process.
package policy
