package logging

import (
	"strconv"
	"strings"
)

// Cut shortens text the worker shows (a log attribute, an error's detail)
// to at most n bytes, not splitting a character, and says how long it was:
// "…(2000 bytes)". Text of n bytes or less is returned as it is.
func Cut[T ~string | ~[]byte](text T, n int) string {
	if len(text) <= n {
		return string(text)
	}
	return strings.ToValidUTF8(string(text[:n]), "") + "…(" + strconv.Itoa(len(text)) + " bytes)"
}

// LastLines is the last n non-blank-ended lines of text, for an error that
// quotes what a program printed: its last words are what say why.
func LastLines(text string, n int) string {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// FirstLine is the first line of text, without surrounding blanks.
func FirstLine(text string) string {
	first, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	return first
}
