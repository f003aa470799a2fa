package installer

import (
	"fmt"
	"os"

	"github.com/fluksio/fluksio-worker/agent/config"
)

const userServiceHelp = "act on the service installed for the current user (install --user-service) rather than the system one; by default the system service, or the user's when only that is installed"

// installedLayout picks the installation a command other than install acts
// on: the one --user-service names if given, else the system service if it
// is installed, else the user's if that is, else the system one (which the
// command then reports as not installed).
func installedLayout(h host, cmd *config.Command, userService bool) (Layout, error) {
	if cmd.Given("user-service") {
		return h.layout(userService)
	}
	system, err := h.layout(false)
	if err != nil {
		return system, err
	}
	if exists(system.UnitPath) {
		return system, nil
	}
	if user, err := h.layout(true); err == nil && exists(user.UnitPath) {
		return user, nil
	}
	return system, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// needRoot refuses a change to the system service made without root, with
// what to do instead.
func (h host) needRoot(l Layout, doing string) error {
	if l.UserService || h.root() {
		return nil
	}
	return fmt.Errorf("%s the system service needs root: run it with sudo", doing)
}
