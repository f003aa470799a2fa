package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// ErrorType is the error type of a call's answer when the policy refused
// it: its own, so an engine or a person can tell it from a node's failure.
const ErrorType = "PolicyRefused"

// What --allow-source accepts.
const (
	SourceAny    = "any"    // shipped source runs (the default: no policy)
	SourceSigned = "signed" // only source signed by a --trust-key key
	SourceNone   = "none"   // no shipped source; module nodes only
)

// ModulesAny and ModulesNone are --allow-module's words besides patterns.
const (
	ModulesAny  = "*"
	ModulesNone = "none"
)

// Policy is the code policy in force. The zero value allows everything.
type Policy struct {
	modules []string // --allow-module patterns; empty allows every module
	source  string   // SourceAny ("" too), SourceSigned or SourceNone
	keys    *KeyRing // the keys signed source may be signed with
	env     []string // --allow-env patterns: what a call's env may set besides Tuning
}

// New makes the policy of the owner's settings; it reads the trusted keys.
func New(modules []string, source string, trustKeys, allowEnv []string) (*Policy, error) {
	p := &Policy{source: source, env: allowEnv}
	if p.source == "" {
		p.source = SourceAny
	}
	for _, m := range modules {
		if err := checkPattern(m); err != nil {
			return nil, fmt.Errorf("--allow-module %q: %w", m, err)
		}
	}
	if slices.Contains(modules, ModulesNone) && len(modules) > 1 {
		return nil, fmt.Errorf("--allow-module: %q allows no module and cannot be given with patterns", ModulesNone)
	}
	p.modules = modules
	if err := checkEnvPatterns(allowEnv); err != nil {
		return nil, err
	}
	switch p.source {
	case SourceAny:
	case SourceNone:
		if len(modules) == 0 {
			return nil, fmt.Errorf("--allow-source none without --allow-module lets nothing run: name the installed modules node calls may import, e.g. --allow-module acme_pipelines.* (or * for any)")
		}
	case SourceSigned:
		if len(trustKeys) == 0 {
			return nil, fmt.Errorf("--allow-source signed needs the keys it accepts: give --trust-key FILE (a public key 'fluksio-worker keygen' made) or a directory of them")
		}
	default:
		return nil, fmt.Errorf("--allow-source %q: expected none, signed or any", source)
	}
	if len(trustKeys) > 0 {
		ring, err := LoadKeyRing(trustKeys)
		if err != nil {
			return nil, err
		}
		p.keys = ring
	}
	return p, nil
}

// On says whether any code policy is in force: a module list, or shipped
// source less than always. With one, a call's env may set only what tunes
// (Tuning, --allow-env) and the runner is never the engine's.
func (p *Policy) On() bool {
	return p != nil && (len(p.modules) > 0 || p.source != SourceAny)
}

// Describe is the policy in force in one line a person reads as a
// sentence, for check, status and the start's log: "on: runs modules
// acme.* only and no shipped source; a call's env may not load code; the
// runner is this worker's".
func (p *Policy) Describe() string {
	if !p.On() {
		return "off: any module and any shipped source run"
	}
	mods := "no installed module"
	switch {
	case slices.Contains(p.modules, ModulesAny):
		mods = "any installed module"
	case slices.Contains(p.modules, ModulesNone):
	case len(p.modules) > 0:
		mods = "modules " + strings.Join(p.modules, ",") + " only"
	}
	src := "no shipped source"
	switch p.source {
	case SourceAny:
		src = "any shipped source"
	case SourceSigned:
		src = "shipped source signed by key " + strings.Join(p.keys.IDs(), ",")
	}
	env := "a call's env may set only tuning variables"
	if len(p.env) > 0 {
		env += " and " + strings.Join(p.env, ",")
	}
	return "on: runs " + mods + " and " + src + "; " + env + "; the runner is the embedded one or a local file"
}

// Refusal is why the policy refused a call: the rule, what it found, and
// what the owner can change.
type Refusal struct {
	Rule   string // the setting that refused it, e.g. "--allow-source signed"
	Reason string
	Change string // what the machine's owner can change to allow it
}

func (r *Refusal) Error() string {
	return "refused by this worker's code policy (" + r.Rule + "): " + r.Reason + ". " + r.Change
}

// Node is what a request's node names: installed code (Module), or shipped
// source (Source, with its file name).
type Node struct {
	Module   string
	Source   string
	Filename string
	HasCode  bool // a node object with source or module was found
	IsModule bool // module, not source
}

// ReadNode reads the request's node object as the embedded runtime does:
// source wins over module when both are given.
func ReadNode(raw json.RawMessage) (Node, error) {
	var n Node
	if len(raw) == 0 || string(raw) == "null" {
		return n, nil
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(raw, &spec); err != nil {
		return n, nil // not an object: the runner answers that, running nothing
	}
	if src, ok := spec["source"]; ok {
		if err := json.Unmarshal(src, &n.Source); err != nil {
			return n, fmt.Errorf("node.source is not a string")
		}
		if f, ok := spec["filename"]; ok {
			_ = json.Unmarshal(f, &n.Filename) // the runtime answers a bad one
		}
		n.HasCode = true
		return n, nil
	}
	if mod, ok := spec["module"]; ok {
		if err := json.Unmarshal(mod, &n.Module); err != nil {
			return n, fmt.Errorf("node.module is not a string")
		}
		n.HasCode, n.IsModule = true, true
	}
	return n, nil
}

// SourceSHA256 is the hex sha256 of the node's source, "" for a module.
func (n Node) SourceSHA256() string {
	if n.IsModule || !n.HasCode {
		return ""
	}
	sum := sha256.Sum256([]byte(n.Source))
	return hex.EncodeToString(sum[:])
}

// CheckNode refuses a node the policy does not allow; nil allows it.
func (p *Policy) CheckNode(n Node) *Refusal {
	if !p.On() || !n.HasCode {
		return nil
	}
	if n.IsModule {
		return p.checkModule(n.Module)
	}
	switch p.source {
	case SourceNone:
		return &Refusal{Rule: "--allow-source none", Reason: "this worker runs no source shipped with a call (" + shownName(n.Filename) + ")",
			Change: "The machine's owner can allow signed source with --allow-source signed and --trust-key, or run the node as an installed module (--allow-module)."}
	case SourceSigned:
		if _, err := p.keys.Verify([]byte(n.Source), time.Now()); err != nil {
			return &Refusal{Rule: "--allow-source signed", Reason: shownName(n.Filename) + ": " + err.Error(), Change: p.signedChange(n, err)}
		}
	}
	return nil
}

// signedChange is what can be done about source the signature check
// refused: sign again (expired), sign with a trusted key or have the owner
// trust this one (untrusted), or sign as the worker expects (the rest).
func (p *Policy) signedChange(n Node, err error) string {
	sign := "'fluksio-worker sign --key KEY " + shownName(n.Filename) + "'"
	trusted := strings.Join(p.keys.IDs(), ",")
	var untrusted *UntrustedKeyError
	var expired *ExpiredError
	switch {
	case errors.As(err, &expired):
		return "Sign the file again: " + sign + " (with --expires later, or none)."
	case errors.As(err, &untrusted):
		return "The author can sign it with a key this worker trusts (" + trusted + "): " + sign + "; or the machine's owner, to trust key " + untrusted.ID +
			", adds its .pub file (from 'fluksio-worker keygen') to --trust-key and reloads: fluksio-worker reload."
	}
	return "Sign the file with " + sign + " using a key this worker trusts (its public key given to --trust-key); trusted keys: " + trusted + "."
}

func shownName(filename string) string {
	if filename == "" {
		return "node.py"
	}
	return cut(filename, 200)
}

func cut(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// moduleName is a dotted Python module name, as an import statement
// takes it (no relative dots, no path separators).
var moduleName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)

func checkPattern(p string) error {
	if p == ModulesAny || p == ModulesNone {
		return nil
	}
	if moduleName.MatchString(strings.TrimSuffix(p, ".*")) {
		return nil
	}
	return fmt.Errorf("expected a module name (acme.train), every module under one (acme.*), %s or %s", ModulesAny, ModulesNone)
}

// matchModule says whether pattern allows module: "pkg.*" allows every
// module under pkg (not pkg itself), "*" every module, anything else only
// that module.
func matchModule(pattern, module string) bool {
	switch {
	case pattern == ModulesAny:
		return true
	case pattern == ModulesNone:
		return false
	case strings.HasSuffix(pattern, ".*"):
		return strings.HasPrefix(module, strings.TrimSuffix(pattern, "*"))
	}
	return pattern == module
}

func (p *Policy) checkModule(module string) *Refusal {
	if len(p.modules) == 0 {
		// A code policy of source alone: a module node could call any
		// installed function (subprocess.run) with the engine's inputs,
		// so only modules the owner names run.
		return &Refusal{Rule: "--allow-source " + p.source + " without --allow-module",
			Reason: "module " + cut(module, 200) + " is installed code, which runs under a code policy only when --allow-module names it",
			Change: allowChange(module, "The machine's owner can allow it with --allow-module (e.g. "+patternFor(module)+", or * for any installed module).")}
	}
	rule := "--allow-module " + strings.Join(p.modules, ",")
	change := allowChange(module, "The machine's owner can add a pattern for it to --allow-module (e.g. "+patternFor(module)+").")
	if !moduleName.MatchString(module) {
		return &Refusal{Rule: rule, Reason: fmt.Sprintf("%q is not a module name", cut(module, 200)), Change: "Name the module as an import statement would."}
	}
	for _, pat := range p.modules {
		if matchModule(pat, module) {
			return nil
		}
	}
	return &Refusal{Rule: rule, Reason: "module " + module + " is not among the modules this worker runs", Change: change}
}

// systemModules are the top-level modules of Python's standard library
// (and of its packaging tools) that reach the whole machine: files,
// processes, sockets, other code. A code policy keeps them out, and a
// refusal never suggests allowing one.
var systemModules = map[string]bool{
	"os": true, "posix": true, "nt": true, "sys": true, "subprocess": true, "shutil": true, "socket": true, "builtins": true,
	"importlib": true, "ctypes": true, "pty": true, "runpy": true, "code": true, "codeop": true, "pickle": true, "marshal": true,
	"multiprocessing": true, "signal": true, "io": true, "pathlib": true, "tempfile": true, "glob": true, "fcntl": true,
	"resource": true, "asyncio": true, "threading": true, "_thread": true, "webbrowser": true, "http": true, "urllib": true,
	"ftplib": true, "smtplib": true, "pdb": true, "inspect": true, "gc": true, "mmap": true, "select": true, "selectors": true,
	"shlex": true, "site": true, "sysconfig": true, "venv": true, "ensurepip": true, "pip": true, "setuptools": true,
	"distutils": true, "tarfile": true, "zipfile": true, "zipimport": true, "platform": true, "pkgutil": true, "types": true,
}

// allowChange is what to change for a module refused: allow, as change
// says, unless the module is one a code policy keeps out (keptOut): a
// refusal never suggests allowing that.
func allowChange(module, change string) string {
	if kept := keptOut(module); kept != "" {
		top, _, _ := strings.Cut(module, ".")
		return top + " is " + kept + ", which a code policy keeps out: allowed, it lets the engine run anything as this worker's user. Put what the node needs in a module of your own and allow that (e.g. --allow-module acme.*)."
	}
	return change
}

// keptOut says what module is when a code policy keeps it out whatever
// the owner allows ("part of Python's standard library"), else "".
func keptOut(module string) string {
	top, _, _ := strings.Cut(module, ".")
	if systemModules[top] {
		return "part of Python's standard library"
	}
	return ""
}

// patternFor suggests the pattern that allows module's package.
func patternFor(module string) string {
	if i := strings.IndexByte(module, '.'); i > 0 {
		return module[:i] + ".*"
	}
	return module
}
