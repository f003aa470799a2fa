package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/policy"
	"github.com/fluksio/fluksio-worker/platform"
)

// signCommand signs node files in place: a signature line at the end of
// each, which an engine that ships the file's text carries to the worker
// unchanged (SIGNING.md).
func signCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	const usage = `Usage: fluksio-worker sign --key KEY [--expires WHEN] FILE.py...

Signs node files for workers that run --allow-source signed: each file gets
a last line '# fluksio-signature: v1 key=… sig=…' (a line from an earlier
signing is replaced), which covers every byte of the file above it. Sign
the file as the engine will ship it: any later change, even of line
endings, makes workers refuse it. The file is rewritten in place, its mode
kept. SIGNING.md describes the format, for signing elsewhere.

Options:
  --key KEY      the private key, from 'fluksio-worker keygen'
  --expires WHEN
        workers refuse the signature after this: a duration from now in
        days, hours, minutes or seconds (90d, 720h, as every duration of
        this binary) or a date (2027-01-31, or RFC 3339); one already past
        is refused (default: never)

Exit status: 0 signed, 1 a file or the key cannot be read or written, 2 bad
options.
`
	cmd := config.NewCommand("sign", config.HelpText(usage))
	cmd.Operands = true // the files
	keyPath := cmd.String("key", "", "")
	expiresText := cmd.String("expires", "", "")
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	if *keyPath == "" || cmd.NArg() == 0 {
		fmt.Fprintf(stderr, "fluksio-worker sign: give --key KEY and the files to sign\n\n%s", usage)
		return config.ExitUsage
	}
	var expires time.Time
	if *expiresText != "" {
		var err error
		if expires, err = parseExpiry(*expiresText, time.Now()); err != nil {
			fmt.Fprintf(stderr, "fluksio-worker sign: --expires %q: %v\n", *expiresText, err)
			return config.ExitUsage
		}
	}
	key, err := policy.ReadPrivateKey(*keyPath)
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker sign: %v\n", err)
		return config.ExitFailed
	}
	for _, path := range cmd.Args() {
		if err := signFile(path, key, expires); err != nil {
			fmt.Fprintf(stderr, "fluksio-worker sign: %v\n", err)
			return config.ExitFailed
		}
		fmt.Fprintf(stdout, "signed %s\n", path)
	}
	return config.ExitOK
}

func signFile(path string, key ed25519.PrivateKey, expires time.Time) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	signed := policy.Sign(src, key, expires)
	return platform.CopyFileAtomic(path, bytes.NewReader(signed), st.Mode().Perm(), platform.KeepOwner)
}

// parseExpiry reads --expires: a duration from now, read as every
// duration of this binary is (config.ParseDuration: 90d, 720h), a date
// (the end of that day, UTC) or an RFC 3339 time. A time already past is
// refused: every worker would refuse the signature at once.
func parseExpiry(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	var t time.Time
	if d, err := config.ParseDuration(v); err == nil {
		if d <= 0 {
			return time.Time{}, errors.New("a duration from now must be positive, e.g. 90d")
		}
		t = now.Add(d)
	} else if day, err := time.Parse("2006-01-02", v); err == nil {
		t = day.Add(24*time.Hour - time.Second)
	} else if t, err = time.Parse(time.RFC3339, v); err != nil {
		return time.Time{}, errors.New("expected a duration from now (" + config.DurationSyntax + ") or a date (2027-01-31, or RFC 3339)")
	}
	if !t.After(now) {
		return time.Time{}, fmt.Errorf("%s is in the past, so every worker would refuse the signature at once: give a later date, or a duration from now such as 90d", t.UTC().Format(time.RFC3339))
	}
	return t, nil
}
