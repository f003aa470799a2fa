package config

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"
)

// ReadTokenFrom reads `--token -` (of run and install): the first line of
// standard input, so a token can be pasted or piped (`pass show fluksio |
// fluksio-worker install --token - …`) without entering shell history or the process list. At a
// terminal it asks, without echoing the paste.
func ReadTokenFrom(stdin io.Reader) (string, error) {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(os.Stderr, "Paste the worker token and press Enter (it is not shown): ")
		secret, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(os.Stderr)
		if err != nil {
			return "", fmt.Errorf("reading the token from the terminal: %w", err)
		}
		stdin = strings.NewReader(string(secret))
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
