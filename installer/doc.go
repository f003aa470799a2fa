// Package installer turns `fluksio-worker run` into an OS service: it writes
// the protected config file that `run --config` reads, renders the systemd
// unit or launchd plist, and drives the service manager (through
// github.com/kardianos/service) for install, uninstall, start, stop, restart,
// reload and status. `check` is here too: it is what a person runs next to a
// service that does not attach.
//
// Where things live, per OS and per system or user service, is in layout.go;
// the unit in unit.go, the plist in plist.go; each command in its own file.
package installer
