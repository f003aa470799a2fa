package policy

import (
	"errors"
	"path"
	"sort"
	"strings"
)

// A call's env under a code policy is an allow-list: the variables below,
// which only tune how the node runs, and those the owner names with
// --allow-env. A deny-list of the variables that load code cannot be
// complete: every library a node imports, and every program it starts,
// reads its own (OPENSSL_CONF loads an engine's .so when Python imports
// hashlib; BASH_FUNC_name%% defines a function a bash script then runs;
// GIT_CONFIG_COUNT/KEY_0/VALUE_0 give git a core.fsmonitor command to run),
// and a new release adds more. A call that sets any other variable is
// refused, not run with it dropped: a node that needs it would fail
// later, and less clearly.

// TuningVar is a variable a call may set under any code policy: its name
// (a pattern, as --allow-env takes), why it only tunes, and, for one whose
// value could also name a file, which values it accepts.
type TuningVar struct {
	Name string
	Why  string
	// valueOK refuses a value that is a path rather than a name; nil
	// accepts any value.
	valueOK func(string) bool
	Values  string // what valueOK accepts, for the refusal
}

// Tuning is the built-in allow-list; docs/security.md's code policy section says
// the same of each, one line each (a test holds it to this table).
var Tuning = []TuningVar{
	{Name: "OMP_NUM_THREADS", Why: "OpenMP's thread count, a number"},
	{Name: "MKL_NUM_THREADS", Why: "Intel MKL's thread count, a number"},
	{Name: "OPENBLAS_NUM_THREADS", Why: "OpenBLAS's thread count, a number"},
	{Name: "NUMEXPR_NUM_THREADS", Why: "numexpr's thread count, a number"},
	{Name: "TOKENIZERS_PARALLELISM", Why: "whether Hugging Face tokenizers use threads, true or false"},
	{Name: "CUDA_VISIBLE_DEVICES", Why: "which GPUs CUDA shows the call (read as positions in the worker's own mask, where it has one); it chooses devices and loads nothing"},
	{Name: "PYTHONUNBUFFERED", Why: "Python writes its output unbuffered"},
	{Name: "PYTHONHASHSEED", Why: "the seed of Python's str hashing (a number), so that set order repeats from run to run; it names no file and imports nothing"},
	{Name: "LANG", Why: "the locale, by name", valueOK: notAPath, Values: "a locale name, not a path"},
	{Name: "LC_*", Why: "the locale of one category, by name", valueOK: notAPath, Values: "a locale name, not a path"},
	{Name: "TZ", Why: "the time zone, by name", valueOK: zoneName, Values: "a zone name such as Europe/Paris, not a path"},
}

// notAPath: the C library reads a locale named by an absolute path from
// that directory, files the engine could have written (load_artifact).
func notAPath(v string) bool { return !strings.Contains(v, "/") }

// zoneName: TZ=/file or TZ=:../../file reads that file as the zone.
func zoneName(v string) bool {
	v = strings.TrimPrefix(v, ":")
	return !strings.HasPrefix(v, "/") && !strings.Contains(v, "..")
}

// codeLoaders are variables known to make a program load code, the ones a
// call is most likely to try: --allow-env patterns that match one are
// warned about at start.
var codeLoaders = []string{
	"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME",
	"PATH", "HOME", "BASH_ENV", "ENV", "BASH_FUNC_echo%%", "OPENSSL_CONF", "GCONV_PATH", "NODE_OPTIONS", "PERL5OPT",
	"GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT", "GIT_SSH_COMMAND", "GIT_TEMPLATE_DIR", "SSH_ASKPASS", "OMP_TOOL_LIBRARIES",
	"NCCL_NET_PLUGIN", "CUDA_INJECTION64_PATH", "MPLBACKEND", "HF_ENDPOINT", "PIP_INDEX_URL", "SSL_CERT_FILE", "HTTPS_PROXY",
}

// checkEnvPatterns refuses an --allow-env pattern that is not one.
func checkEnvPatterns(patterns []string) error {
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil || p == "" || strings.ContainsAny(p, "=/ \t") {
			return errors.New("--allow-env " + p + ": expected a variable name or a pattern of one, e.g. WANDB_API_KEY or WANDB_*")
		}
	}
	return nil
}

// EnvWarnings are the --allow-env patterns that let a call set a variable
// known to load code, each with one such variable.
func (p *Policy) EnvWarnings() []string {
	var out []string
	for _, pat := range p.env {
		for _, name := range codeLoaders {
			if ok, _ := path.Match(pat, name); ok {
				out = append(out, "--allow-env "+pat+" lets a call set "+name+", with which it can make a program load code the code policy never checked")
				break
			}
		}
	}
	return out
}

// CheckEnv refuses a call whose env (KEY=VALUE entries) sets a variable
// the policy does not allow, with a policy on. workerPATH is the worker's
// own PATH: a call may repeat it, not change it.
func (p *Policy) CheckEnv(env []string, workerPATH string) *Refusal {
	if !p.On() {
		return nil
	}
	var names, why []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "PATH" && v == workerPATH {
			continue
		}
		if ok, values := p.envAllowed(k, v); !ok {
			names = append(names, k)
			if values != "" {
				why = append(why, k+" must be "+values)
			}
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	list := cut(strings.Join(names, ", "), 300)
	reason := "the call's env sets " + list + ", which a call may not set under a code policy: only variables that tune (OMP_NUM_THREADS, LANG, TZ...) and those --allow-env names"
	if len(why) > 0 {
		sort.Strings(why)
		reason += " (" + cut(strings.Join(why, "; "), 300) + ")"
	}
	return &Refusal{Rule: "a code policy is on", Reason: reason,
		Change: "Leave it out of the node's env; if it only tunes and cannot make a program load code, the machine's owner can allow it with --allow-env " + cut(strings.Join(names, ","), 300) + " (or a pattern such as WANDB_*)."}
}

// envAllowed says whether a call may set name to value; when the name is
// allowed but not the value, values says what it must be.
func (p *Policy) envAllowed(name, value string) (ok bool, values string) {
	for _, pat := range p.env {
		if m, _ := path.Match(pat, name); m {
			return true, ""
		}
	}
	for _, t := range Tuning {
		if m, _ := path.Match(t.Name, name); m {
			if t.valueOK != nil && !t.valueOK(value) {
				return false, t.Values
			}
			return true, ""
		}
	}
	return false, ""
}

// EnvKeys are the env entries' names, sorted, for a hook.
func EnvKeys(env []string) []string {
	keys := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
