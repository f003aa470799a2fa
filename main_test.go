package main

import (
	"context"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// The command line as main wires it, in this process.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--version"}, 0, "fluksio-worker "},
		{[]string{"--help"}, 0, "Commands:"},
		{nil, 2, "Usage:"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		// Bare flags mean run, as the Python agent's command line did.
		{[]string{"--url", "ws://127.0.0.1:1/api/v1/workers/attach", "--token", "t", "--parallel", "zero"}, 2, "--parallel"},
	} {
		var out strings.Builder
		if code := dispatch(context.Background(), tc.args, &out, &out); code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("fluksio-worker %q: exit %d, %q; want %d and %q", tc.args, code, out.String(), tc.code, tc.want)
		}
	}
	help := mainOutput(t, "run", "--help")
	for _, o := range config.Options {
		if !strings.Contains(help, "--"+o.Name+" ") {
			t.Errorf("run --help does not document --%s", o.Name)
		}
	}
}
