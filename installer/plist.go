package installer

import (
	"fmt"
	"path/filepath"
	"strings"
)

// launchdPlist is the job of a LaunchDaemon (@USERNAME@ set) or LaunchAgent.
//   - RunAtLoad starts it at boot (or login) and when install loads it.
//   - KeepAlive/SuccessfulExit=false restarts it when it exits non-zero and
//     leaves it stopped after a clean exit. launchd has no equivalent of
//     systemd's RestartPreventExitStatus, so a refused token is retried at
//     launchd's throttle (every 10 s); the log says why.
//   - ExitTimeOut: as TimeoutStopSec in the systemd unit.
//   - Both output streams go to one log file, as the journal would hold them.
const launchdPlist = `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- Written by 'fluksio-worker install'; running it again rewrites this file. -->
<plist version="1.0">
<dict>
	<key>Label</key>
	<string>@LABEL@</string>
	<key>ProgramArguments</key>
	<array>
		<string>@EXEC@</string>
		<string>run</string>
		<string>--config</string>
		<string>@CONFIG@</string>
	</array>
@USERNAME@	<key>RunAtLoad</key>
	<true/>
	<key>KeepAlive</key>
	<dict>
		<key>SuccessfulExit</key>
		<false/>
	</dict>
	<key>ExitTimeOut</key>
	<integer>@STOP_TIMEOUT@</integer>
	<key>StandardOutPath</key>
	<string>@LOG@</string>
	<key>StandardErrorPath</key>
	<string>@LOG@</string>
</dict>
</plist>
`

// renderPlist returns the launchd job for p; logDir is where its log goes.
func renderPlist(p serviceParams, logDir string) (string, error) {
	if err := checkServiceParams(p); err != nil {
		return "", err
	}
	username := ""
	if p.Account != "" {
		username = "\t<key>UserName</key>\n\t<string>" + xmlText(p.Account) + "</string>\n"
	}
	r := strings.NewReplacer(
		"@LABEL@", xmlText(launchdLabel),
		"@EXEC@", xmlText(p.Executable),
		"@CONFIG@", xmlText(p.ConfigPath),
		"@USERNAME@", username,
		"@STOP_TIMEOUT@", fmt.Sprint(stopTimeout(p.CancelGrace)),
		"@LOG@", xmlText(filepath.Join(logDir, unitName+".log")),
	)
	return r.Replace(launchdPlist), nil
}

// xmlText escapes a value for a plist <string>.
func xmlText(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;").Replace(s)
}
