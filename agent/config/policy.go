package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fluksio/fluksio-worker/agent/hook"
	"github.com/fluksio/fluksio-worker/agent/policy"
)

// resolvePolicy reads the code policy's settings and its trusted keys into
// c.Policy, so that a key that cannot be read stops the worker (and a
// reload) before it dials, rather than refusing every call later.
func (c *Config) resolvePolicy() error {
	if err := c.checkWhoDecides(); err != nil {
		return err
	}
	p, err := policy.New(c.AllowModule, c.AllowSource, c.TrustKeys, c.AllowEnv)
	if err != nil {
		return &UsageError{err}
	}
	if len(c.TrustKeys) > 0 && c.AllowSource != policy.SourceSigned {
		c.Warnings = append(c.Warnings, "--trust-key is given but --allow-source is not signed: the keys are read and not used")
	}
	if len(c.AllowEnv) > 0 && !p.On() {
		c.Warnings = append(c.Warnings, "--allow-env is given but no code policy is on (--allow-module, --allow-source none or signed): a call's env may set anything")
	}
	if p.On() {
		c.Warnings = append(c.Warnings, p.EnvWarnings()...)
	}
	c.Policy = p
	// A hook whose script cannot run would decline every call: that is a
	// configuration that does not work, said before the worker dials.
	for _, h := range []struct{ what, command string }{{"--pre-call-hook", c.PreCallHook}, {"--post-call-hook", c.PostCallHook}} {
		if err := hook.CheckProgram(h.what, h.command); err != nil {
			return &UsageError{err}
		}
	}
	return nil
}

// checkWhoDecides refuses trusted keys (under --allow-source signed) and
// hook programs that a user other than root and the worker's may change
// (checkOthersCannotWrite): their code would run as the worker.
func (c *Config) checkWhoDecides() error {
	if c.AllowSource == policy.SourceSigned {
		for _, p := range c.TrustKeys {
			if err := checkOthersCannotWrite(p, "--trust-key "+p); err != nil {
				return err
			}
			files, err := policy.KeyFiles(p)
			if err != nil {
				return &UsageError{err}
			}
			for _, f := range files {
				if f != p {
					if err := checkOthersCannotWrite(f, "--trust-key "+f); err != nil {
						return err
					}
				}
			}
		}
	}
	for _, h := range []struct{ flag, command string }{{"--pre-call-hook", c.PreCallHook}, {"--post-call-hook", c.PostCallHook}} {
		for _, prog := range hook.Programs(h.command) {
			what := "the " + h.flag + " program " + prog
			if _, err := os.Stat(prog); errors.Is(err, fs.ErrNotExist) {
				// Missing now (the hook says so when it runs); nobody else
				// may be able to put it there.
				abs, _ := filepath.Abs(prog)
				if err := checkAncestors(abs, what, "make every directory above it writable only by root or this worker's user"); err != nil {
					return err
				}
				continue
			}
			if err := checkOthersCannotWrite(prog, what); err != nil {
				return err
			}
		}
	}
	return nil
}

// PolicyText is the code policy and the call hooks in force, in one line,
// for check, status and the start's log.
func (c Config) PolicyText() string {
	text := "code policy " + c.Policy.Describe()
	if c.PreCallHook != "" {
		text += "; pre-call hook " + strconv.Quote(c.PreCallHook)
	}
	if c.PostCallHook != "" {
		text += "; post-call hook " + strconv.Quote(c.PostCallHook)
	}
	return text
}

// HookBound is how long a call hook may run.
func (c Config) HookBound() time.Duration {
	if c.HookTimeout > 0 {
		return c.HookTimeout
	}
	return DefaultHookTimeout
}
