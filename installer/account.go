package installer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"

	"github.com/fluksio/fluksio-worker/platform"
)

// account is the user a system service runs as.
type account struct {
	Name     string
	UID, GID int
	Home     string
}

func (a account) owner() platform.Owner { return platform.Owner{UID: a.UID, GID: a.GID} }

// gpuGroups own the GPU device nodes on Linux (/dev/nvidia* and /dev/dri/*
// are group video or render on Debian, Ubuntu and RHEL), so the service
// account joins whichever exist.
var gpuGroups = []string{"video", "render"}

// lookupAccount finds a user by name. The binary is built without cgo, so
// os/user reads only /etc/passwd; `id` asks NSS as well (LDAP and SSSD
// accounts, common on the clusters workers run on).
func lookupAccount(ctx context.Context, name string) (account, error) {
	if u, err := user.Lookup(name); err == nil {
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return account{Name: u.Username, UID: uid, GID: gid, Home: u.HomeDir}, nil
	}
	uid, err1 := idField(ctx, "-u", name)
	gid, err2 := idField(ctx, "-g", name)
	if err := errors.Join(err1, err2); err != nil {
		return account{}, fmt.Errorf("no user %q on this machine", name)
	}
	return account{Name: name, UID: uid, GID: gid}, nil
}

func idField(ctx context.Context, flag, name string) (int, error) {
	out, err := exec.CommandContext(ctx, "id", flag, name).Output()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(out)))
}

// serviceAccount returns the account a system service runs as: --user if
// given (it must exist), else the fluksio-worker system account, created on
// Linux if missing and added to the GPU groups. Progress goes to out.
func serviceAccount(ctx context.Context, h host, given string, out io.Writer) (account, error) {
	name := given
	if name == "" && h.GOOS == "darwin" {
		// macOS has no one-line way to make a hidden service account, so a
		// LaunchDaemon runs as the person who ran sudo unless told otherwise.
		name = h.Getenv("SUDO_USER")
		if name == "" || name == "root" {
			return account{}, errors.New("on macOS, say which account the worker runs as: --user NAME (or install it for yourself with --user-service, without sudo)")
		}
	}
	if name == "" {
		name = defaultAccount
	}
	a, err := lookupAccount(ctx, name)
	switch {
	case err != nil && name == defaultAccount:
		if a, err = createSystemAccount(ctx, out); err != nil {
			return account{}, err
		}
	case err != nil:
		return account{}, fmt.Errorf("--user %s: %w; create it first, or leave --user out to use the %s system account", name, err, defaultAccount)
	}
	if a.UID == 0 {
		// Node code comes from the engine; the engine must not own the machine.
		return account{}, fmt.Errorf("--user %s: the worker runs code the engine sends, so it must not run as root; pick an unprivileged account", name)
	}
	if name == defaultAccount && h.GOOS == "linux" {
		if err := joinGPUGroups(ctx, a, out); err != nil {
			return account{}, err
		}
	}
	return a, nil
}

// createSystemAccount makes the fluksio-worker system user: no login, no
// password, home in the state directory (which systemd creates for it).
func createSystemAccount(ctx context.Context, out io.Writer) (account, error) {
	shell := "/usr/sbin/nologin"
	for _, s := range []string{"/usr/sbin/nologin", "/sbin/nologin", "/bin/false"} {
		if _, err := os.Stat(s); err == nil {
			shell = s
			break
		}
	}
	args := []string{"--system", "--user-group", "--no-create-home",
		"--home-dir", "/var/lib/" + unitName, "--shell", shell,
		"--comment", "Fluksio worker", defaultAccount}
	if msg, err := exec.CommandContext(ctx, "useradd", args...).CombinedOutput(); err != nil {
		return account{}, fmt.Errorf("creating the %s system user: useradd: %v: %s (create it yourself, or pass --user NAME)", defaultAccount, err, strings.TrimSpace(string(msg)))
	}
	fmt.Fprintf(out, "Created the system user %s.\n", defaultAccount)
	return lookupAccount(ctx, defaultAccount)
}

// joinGPUGroups adds the account to the GPU device groups this machine has.
func joinGPUGroups(ctx context.Context, a account, out io.Writer) error {
	u := &user.User{Uid: strconv.Itoa(a.UID), Gid: strconv.Itoa(a.GID), Username: a.Name}
	member := map[string]bool{}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			member[id] = true
		}
	}
	var missing []string
	for _, name := range gpuGroups {
		g, err := user.LookupGroup(name)
		if err != nil || member[g.Gid] {
			continue
		}
		missing = append(missing, name)
	}
	if len(missing) == 0 {
		return nil
	}
	groups := strings.Join(missing, ",")
	if msg, err := exec.CommandContext(ctx, "usermod", "--append", "--groups", groups, a.Name).CombinedOutput(); err != nil {
		return fmt.Errorf("adding %s to the GPU groups %s: usermod: %v: %s", a.Name, groups, err, strings.TrimSpace(string(msg)))
	}
	noun := "the group"
	if len(missing) > 1 {
		noun = "the groups"
	}
	fmt.Fprintf(out, "Added %s to %s %s, so it can use the GPUs.\n", a.Name, noun, strings.Join(missing, " and "))
	return nil
}

// currentAccount is the person running a user-service install.
func currentAccount() account {
	a := account{UID: os.Getuid(), GID: os.Getgid()}
	if u, err := user.Current(); err == nil {
		a.Name, a.Home = u.Username, u.HomeDir
	}
	return a
}
