package config

import (
	"strconv"
	"time"

	"github.com/fluksio/fluksio-worker/agent/hook"
	"github.com/fluksio/fluksio-worker/agent/policy"
)

// resolvePolicy reads the code policy's settings and its trusted keys into
// c.Policy, so that a key that cannot be read stops the worker (and a
// reload) before it dials, rather than refusing every call later.
func (c *Config) resolvePolicy() error {
	p, err := policy.New(c.AllowModule, c.AllowSource, c.TrustKeys)
	if err != nil {
		return &UsageError{err}
	}
	if len(c.TrustKeys) > 0 && c.AllowSource != policy.SourceSigned {
		c.Warnings = append(c.Warnings, "--trust-key is given but --allow-source is not signed: the keys are read and not used")
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
