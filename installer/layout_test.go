package installer

import (
	"errors"
	"testing"
)

func TestLayouts(t *testing.T) {
	d := dirs{Home: "/home/ada"}
	for _, tc := range []struct {
		goos        string
		user        bool
		d           dirs
		unit, cfg   string
		state, logs string
	}{
		{"linux", false, d, "/etc/systemd/system/fluksio-worker.service", "/etc/fluksio-worker/config.toml", "/var/lib/fluksio-worker", ""},
		{"linux", true, d, "/home/ada/.config/systemd/user/fluksio-worker.service", "/home/ada/.config/fluksio-worker/config.toml", "/home/ada/.local/state/fluksio-worker", ""},
		{"linux", true, dirs{Home: "/home/ada", XDGConfigHome: "/cfg", XDGStateHome: "/st"}, "/home/ada/.config/systemd/user/fluksio-worker.service", "/cfg/fluksio-worker/config.toml", "/st/fluksio-worker", ""},
		{"darwin", false, d, "/Library/LaunchDaemons/io.fluksio.worker.plist", "/Library/Application Support/fluksio-worker/config.toml", "/Library/Application Support/fluksio-worker/state", "/Library/Logs/fluksio-worker"},
		{"darwin", true, d, "/home/ada/Library/LaunchAgents/io.fluksio.worker.plist", "/home/ada/Library/Application Support/fluksio-worker/config.toml", "/home/ada/Library/Application Support/fluksio-worker", "/home/ada/Library/Logs/fluksio-worker"},
	} {
		l, err := layoutFor(tc.goos, tc.user, tc.d)
		if err != nil {
			t.Fatal(err)
		}
		if l.UnitPath != tc.unit || l.ConfigPath != tc.cfg || l.StateDir != tc.state || l.LogDir != tc.logs {
			t.Errorf("%s user=%v: got %+v", tc.goos, tc.user, l)
		}
	}
}

func TestLayoutRefusesOtherSystems(t *testing.T) {
	_, err := layoutFor("windows", false, dirs{})
	if !errors.Is(err, errUnsupportedOS) {
		t.Errorf("windows: %v", err)
	}
	if _, err := layoutFor("linux", true, dirs{}); err == nil {
		t.Error("a user service without a home directory should be refused")
	}
}
