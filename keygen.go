package main

import (
	"context"
	"fmt"
	"io"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/policy"
)

// keygenCommand makes a key pair for signing node source (SIGNING.md):
// the private key stays with whoever signs (a developer, a CI job), the
// public key goes to each worker's --trust-key.
func keygenCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	const usage = `Usage: fluksio-worker keygen [--out PATH]

Makes an ed25519 key pair for signing node files (see SIGNING.md): the
private key in PATH (mode 0600; keep it where node files are signed, never on
a worker) and the public key in PATH.pub, which workers trust with
--trust-key PATH.pub and --allow-source signed. An existing file is never
overwritten. Prints the key id that signature lines name.

Options:
  --out PATH  where to write the private key (default: fluksio-signing)

Exit status: 0 written, 1 a file exists or cannot be written, 2 bad options.
`
	cmd := config.NewCommand("keygen", config.HelpText(usage))
	out := cmd.String("out", "fluksio-signing", "")
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	id, err := policy.GenerateKey(*out)
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker keygen: %v\n", err)
		return config.ExitFailed
	}
	fmt.Fprintf(stdout, "key %s\nprivate key: %s (keep it secret; sign with 'fluksio-worker sign --key %s FILE.py')\npublic key:  %s%s (give it to workers: --trust-key)\n",
		id, *out, *out, *out, policy.PublicKeySuffix)
	return config.ExitOK
}
