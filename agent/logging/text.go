package logging

import (
	"fmt"
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

// FormatBytes says a size the way a user writes it in an option: 256MiB,
// 16KiB, else in bytes.
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
