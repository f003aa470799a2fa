package installer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// readTokenFrom reads `--token -`: the first line of standard input, so a
// token can be pasted or piped (`pass show fluksio | fluksio-worker install
// --token - …`) without entering shell history or the process list. At a
// terminal it asks; the paste is echoed, as the binary has no terminal
// library to turn echo off.
func readTokenFrom(stdin io.Reader) (string, error) {
	if f, ok := stdin.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			fmt.Fprint(os.Stderr, "Paste the worker token and press Enter: ")
		}
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("reading the token from standard input: %w", err)
	}
	tok := strings.TrimSpace(line)
	if tok == "" {
		return "", errors.New("--token -: standard input held no token (pipe it in, or paste it when asked)")
	}
	return tok, nil
}
