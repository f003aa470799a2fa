package installer

import (
	"io"
	"os"
	"runtime"
)

// host is what the commands read from the machine and the person running
// them. The commands use thisHost(); tests build one to ask, say, what a
// non-root user sees, without being that user.
type host struct {
	GOOS   string
	EUID   int
	Stdin  io.Reader
	Getenv func(string) string
	// Executable is the fluksio-worker binary the service will run.
	Executable func() (string, error)
}

func thisHost() host {
	return host{
		GOOS:       runtime.GOOS,
		EUID:       os.Geteuid(),
		Stdin:      os.Stdin,
		Getenv:     os.Getenv,
		Executable: os.Executable,
	}
}

func (h host) root() bool { return h.EUID == 0 }

// dirs returns the directories a user service would use.
func (h host) dirs() dirs {
	home := h.Getenv("HOME")
	if home == "" && h.GOOS == runtime.GOOS {
		home, _ = os.UserHomeDir()
	}
	return dirs{Home: home, XDGConfigHome: h.Getenv("XDG_CONFIG_HOME"), XDGStateHome: h.Getenv("XDG_STATE_HOME")}
}

// layout is where a system (userService false) or user service lives here.
func (h host) layout(userService bool) (Layout, error) {
	return layoutFor(h.GOOS, userService, h.dirs())
}
