package installer

import "testing"

// Both units let the worker tell systemd when it is ready and what it is
// doing, and have it restarted when its main loop stops pinging.
func TestUnitsAreNotifyWithAWatchdog(t *testing.T) {
	for _, userService := range []bool{false, true} {
		unit, err := renderUnit(systemParams, userService)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range []string{"Type=notify", "NotifyAccess=main", "WatchdogSec=30"} {
			if !hasLine(unit, line) {
				t.Errorf("the unit (user service: %v) lacks %q", userService, line)
			}
		}
		if hasLine(unit, "Type=exec") {
			t.Errorf("the unit (user service: %v) still says Type=exec", userService)
		}
	}
}
