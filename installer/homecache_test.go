package installer

import "testing"

// A service running as a person keeps its calls' caches in ~/.cache,
// which its sandbox would show read-only: install shows it writable in
// the config, once; a service account of its own, a sandbox said off, a
// config that already shows the home or the cache, and macOS get nothing.
func TestInstallKeepsAPersonsCachesWritable(t *testing.T) {
	linux, mac := Layout{GOOS: "linux"}, Layout{GOOS: "darwin"}
	alice := account{Name: "alice", Home: "/home/alice"}
	service := account{Name: "fluksio-worker", Home: "/var/lib/fluksio-worker"}
	for _, c := range []struct {
		name   string
		l      Layout
		acct   account
		values map[string]any
		want   string
	}{
		{"person", linux, alice, map[string]any{}, "/home/alice/.cache:rw"},
		{"root", linux, account{Name: "root", Home: "/root"}, map[string]any{}, "/root/.cache:rw"},
		{"service account", linux, service, map[string]any{}, ""},
		{"sandbox off", linux, alice, map[string]any{"sandbox": "off"}, ""},
		{"given on the command line", linux, alice, map[string]any{"sandbox-bind": "/data,/home/alice/.cache:rw"}, ""},
		{"home given in the config", linux, alice, map[string]any{"sandbox-bind": []any{"/home/alice"}}, ""},
		{"other paths given", linux, alice, map[string]any{"sandbox-bind": []any{"/data"}}, "/home/alice/.cache:rw"},
		{"macOS", mac, alice, map[string]any{}, ""},
	} {
		if got := homeCacheBind(c.l, c.acct, c.values); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := withBind([]any{"/data"}, "/home/alice/.cache:rw"); len(got.([]any)) != 2 {
		t.Errorf("a config's list grew to %v", got)
	}
	if got := withBind("/data", "/home/alice/.cache:rw"); got != "/data,/home/alice/.cache:rw" {
		t.Errorf("a command line's text became %v", got)
	}
}
