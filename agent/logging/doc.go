// Package logging owns how the worker shows text: the logger (text or
// JSON, on stderr or the service's journal), the Redactor that keeps the
// token out of everything written, the Budget that rate-limits a noisy
// source (a node's stderr, an engine's ignored frames), and Cut, LastLines
// and FirstLine, the one set of helpers that shorten text for a log line
// or an error.
package logging
