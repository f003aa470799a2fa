package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// version is stamped by the release build (-ldflags "-X main.version=…").
var version = "dev"

// Set with -X by a build outside a git checkout (a distribution's, from a
// tarball); otherwise, the release's included, they come from the build
// information Go stamps from git, which the release's SBOM also reads.
var (
	commit    = ""
	buildDate = ""
)

// buildInfo is what `version` says about this binary: what an operator
// quotes in a bug report, and a fleet tool compares across machines.
type buildInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`   // the VCS commit it was built from
	Modified  bool   `json:"modified,omitempty"`   // built from a checkout with uncommitted changes
	BuildDate string `json:"build_date,omitempty"` // the commit's time, RFC 3339
	Go        string `json:"go"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	Protocol  int    `json:"protocol"` // the engine protocol version it speaks
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Revision: commit, BuildDate: buildDate, Go: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH, Protocol: protocol.Version}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch {
			case s.Key == "vcs.revision" && b.Revision == "":
				b.Revision = s.Value
			case s.Key == "vcs.time" && b.BuildDate == "":
				b.BuildDate = s.Value
			case s.Key == "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}

// versionCommand is `fluksio-worker version [--json]`.
func versionCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	const usage = `Usage: fluksio-worker version [--json]

Prints the version, the VCS revision and date it was built from, the Go
version, the OS and architecture, and the engine protocol it speaks.

  --json
        print them as one JSON object
Exit status: 0 printed, 2 bad options.
`
	cmd := config.NewCommand("version", config.HelpText(usage))
	asJSON := cmd.Bool("json", false, "")
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	b := readBuildInfo()
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(b)
		return config.ExitOK
	}
	fmt.Fprintf(stdout, "fluksio-worker %s\n", b.Version)
	if b.Revision != "" {
		modified := ""
		if b.Modified {
			modified = " (modified)"
		}
		fmt.Fprintf(stdout, "  revision  %s%s\n", b.Revision, modified)
	}
	if b.BuildDate != "" {
		fmt.Fprintf(stdout, "  built     %s\n", b.BuildDate)
	}
	fmt.Fprintf(stdout, "  go        %s %s/%s\n  protocol  %d\n", b.Go, b.OS, b.Arch, b.Protocol)
	return config.ExitOK
}
