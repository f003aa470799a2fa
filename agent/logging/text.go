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

// HumanBytes says a measured size (free disk, memory held) as a person
// reads it at a glance: 68.8 GiB, 512 MiB, 3 bytes; FormatBytes is for
// a size someone set, which it writes back exactly.
func HumanBytes(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	if n < 1<<10 && n > -1<<10 {
		return fmt.Sprintf("%d bytes", n)
	}
	v, unit := float64(n)/(1<<10), units[0]
	for _, u := range units[1:] {
		if v < 1<<10 && v > -1<<10 {
			break
		}
		v, unit = v/(1<<10), u
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0") + " " + unit
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
