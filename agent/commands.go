package agent

import (
	"context"
	"fmt"
	"io"
)

// Version is the binary's version, set by main.
var Version = "dev"

func SelftestCommand(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "not built yet")
	return 2
}
