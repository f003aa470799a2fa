package policy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func nodeOf(t *testing.T, raw string) Node {
	t.Helper()
	n, err := ReadNode(json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPolicyOffAllowsEverything(t *testing.T) {
	p, err := New(nil, "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.On() {
		t.Fatal("the default policy is on")
	}
	for _, raw := range []string{`{"source": "import os", "filename": "x.py"}`, `{"module": "anything.at.all"}`} {
		if no := p.CheckNode(nodeOf(t, raw)); no != nil {
			t.Errorf("%s refused: %v", raw, no)
		}
	}
	if no := p.CheckEnv([]string{"LD_PRELOAD=/tmp/x.so", "PATH=/tmp"}, "/usr/bin"); no != nil {
		t.Errorf("env refused without a policy: %v", no)
	}
}

func TestPolicyRefusesModuleOutsideItsPatterns(t *testing.T) {
	p, err := New([]string{"acme_pipelines.*", "tools.prep"}, SourceAny, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for mod, allowed := range map[string]bool{
		"acme_pipelines.train": true, "acme_pipelines.a.b": true, "tools.prep": true,
		"acme_pipelines": false, "acme_pipelinesx.y": false, "tools.prep2": false, "os": false, "../acme_pipelines.x": false,
	} {
		no := p.CheckNode(nodeOf(t, `{"module": "`+mod+`"}`))
		if allowed != (no == nil) {
			t.Errorf("module %s: allowed %v, refusal %v", mod, allowed, no)
		}
		if no != nil && !strings.Contains(no.Error(), "--allow-module acme_pipelines.*,tools.prep") {
			t.Errorf("the refusal does not say its rule: %v", no)
		}
		if no != nil && moduleName.MatchString(mod) && mod != "os" && !strings.Contains(no.Error(), "add a pattern for it to --allow-module") {
			t.Errorf("the refusal does not say its rule and what to change: %v", no)
		}
	}
	// Source wins over module, as in the runtime: a module allowed does
	// not smuggle source through.
	none, _ := New([]string{"acme_pipelines.*"}, SourceNone, nil, nil)
	if no := none.CheckNode(nodeOf(t, `{"module": "acme_pipelines.x", "source": "import os"}`)); no == nil || no.Rule != "--allow-source none" {
		t.Errorf("source beside an allowed module: %v", no)
	}
	nomods, _ := New([]string{"none"}, SourceAny, nil, nil)
	if no := nomods.CheckNode(nodeOf(t, `{"module": "none"}`)); no == nil {
		t.Error("--allow-module none allowed a module")
	}
	if _, err := New([]string{"a/b"}, SourceAny, nil, nil); err == nil {
		t.Error("a pattern that names no module was accepted")
	}
}

func TestPolicySignedSourceRule(t *testing.T) {
	key, other := newKey(t, "k"), newKey(t, "o")
	if _, err := New(nil, SourceSigned, nil, nil); err == nil || !strings.Contains(err.Error(), "--trust-key") {
		t.Errorf("signed without keys: %v", err)
	}
	p, err := New(nil, SourceSigned, []string{key + PublicKeySuffix}, nil)
	if err != nil {
		t.Fatal(err)
	}
	node := func(src string) Node {
		b, _ := json.Marshal(map[string]string{"source": src, "filename": "train.py"})
		return nodeOf(t, string(b))
	}
	if no := p.CheckNode(node(signWith(t, key, nodeSource, time.Time{}))); no != nil {
		t.Errorf("signed source refused: %v", no)
	}
	no := p.CheckNode(node(signWith(t, other, nodeSource, time.Time{})))
	if no == nil || !strings.Contains(no.Error(), "train.py") || !strings.Contains(no.Error(), "fluksio-worker sign") {
		t.Errorf("source of an untrusted key: %v", no)
	}
	// Without --allow-module, no installed module runs under a code
	// policy: subprocess.run would take the engine's arguments.
	if no := p.CheckNode(nodeOf(t, `{"module": "subprocess"}`)); no == nil || !strings.Contains(no.Error(), "--allow-module") {
		t.Errorf("a module under --allow-source signed alone: %v", no)
	}
	if _, err := New(nil, SourceNone, nil, nil); err == nil || !strings.Contains(err.Error(), "lets nothing run") {
		t.Errorf("--allow-source none alone: %v", err)
	}
	if !strings.Contains(p.Describe(), "source signed by key") || !strings.HasPrefix(p.Describe(), "on: runs no installed module and shipped source signed by key ") {
		t.Errorf("describe: %s", p.Describe())
	}
}

// TestPolicyEnvIsAnAllowList: under a code policy a call's env may set
// only the tuning variables and what --allow-env names. The variables
// below each make a program load or run code that no rule checked, and a
// deny-list missed most of them (OPENSSL_CONF, BASH_FUNC_x%%, git's config
// by environment...); each is refused by default, and named in the refusal
// with the option that would allow it.
func TestPolicyEnvIsAnAllowList(t *testing.T) {
	p, err := New([]string{"acme.*"}, SourceNone, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	doors := []string{"LD_PRELOAD=/tmp/evil.so", "LD_LIBRARY_PATH=/tmp", "PYTHONPATH=/tmp", "PYTHONSTARTUP=/tmp/x.py",
		"PYTHONHOME=/tmp", "PYTHONINSPECT=1", "PYTHONWARNINGS=ignore::evil.Warning", "PATH=/tmp:/usr/bin", "BASH_ENV=/tmp/x", "GCONV_PATH=/tmp",
		"OPENSSL_CONF=/cache/artifacts/openssl.cnf", "BASH_FUNC_echo%%=() { id; }", "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=core.fsmonitor",
		"GIT_CONFIG_VALUE_0=/tmp/x", "GIT_CONFIG_PARAMETERS='core.fsmonitor'='/tmp/x'", "OMP_TOOL_LIBRARIES=/tmp/tool.so",
		"NCCL_NET_PLUGIN=/tmp/net.so", "NCCL_TUNER_PLUGIN=/tmp/tuner.so", "GIT_TEMPLATE_DIR=/tmp/hooks", "SSH_ASKPASS=/tmp/x",
		"HF_ENDPOINT=https://evil.example", "PIP_INDEX_URL=https://evil.example/simple", "HTTPS_PROXY=http://evil.example:3128",
		"SSL_CERT_FILE=/cache/artifacts/ca.pem", "http_proxy=http://evil.example:3128", "omp_num_threads=4",
		"LC_ALL=/cache/artifacts/locale", "LANG=/tmp", "TZ=/cache/artifacts/zone", "TZ=:../../../tmp/zone"}
	for _, kv := range doors {
		no := p.CheckEnv([]string{"OMP_NUM_THREADS=4", kv}, "/usr/bin")
		key, _, _ := strings.Cut(kv, "=")
		if no == nil || !strings.Contains(no.Error(), "sets "+key+",") || !strings.Contains(no.Error(), "--allow-env "+key) {
			t.Errorf("%s: %v", kv, no)
		}
	}
	// A proxy with the authority it needs (a man in the middle for pip or
	// huggingface_hub): both named at once.
	if no := p.CheckEnv([]string{"HTTPS_PROXY=http://evil.example:3128", "SSL_CERT_FILE=/cache/ca.pem"}, "/usr/bin"); no == nil ||
		!strings.Contains(no.Error(), "HTTPS_PROXY, SSL_CERT_FILE") || !strings.Contains(no.Error(), "--allow-env HTTPS_PROXY,SSL_CERT_FILE") {
		t.Errorf("a proxy and its authority: %v", no)
	}
	if no := p.CheckEnv([]string{"TZ=/tmp/zone"}, "/usr/bin"); no == nil || !strings.Contains(no.Error(), "TZ must be a zone name") {
		t.Errorf("TZ as a file: %v", no)
	}
	for _, kv := range []string{"PATH=/usr/bin", "PYTHONUNBUFFERED=1", "PYTHONHASHSEED=0", "CUDA_VISIBLE_DEVICES=0", "OMP_NUM_THREADS=4",
		"MKL_NUM_THREADS=2", "OPENBLAS_NUM_THREADS=2", "NUMEXPR_NUM_THREADS=2", "TOKENIZERS_PARALLELISM=false",
		"LANG=C.UTF-8", "LC_ALL=en_US.UTF-8", "LC_NUMERIC=de_DE.UTF-8", "TZ=Europe/Paris", "TZ=:America/New_York", "TZ=UTC"} {
		if no := p.CheckEnv([]string{kv}, "/usr/bin"); no != nil {
			t.Errorf("%s refused: %v", kv, no)
		}
	}

	// What the owner adds with --allow-env, by name or by pattern.
	owner, err := New([]string{"acme.*"}, SourceNone, nil, []string{"WANDB_*", "SEED"})
	if err != nil {
		t.Fatal(err)
	}
	if no := owner.CheckEnv([]string{"WANDB_PROJECT=x", "WANDB_MODE=offline", "SEED=1", "OMP_NUM_THREADS=4"}, "/usr/bin"); no != nil {
		t.Errorf("--allow-env WANDB_*,SEED refused: %v", no)
	}
	if no := owner.CheckEnv([]string{"WANDB_PROJECT=x", "SEEDS=1"}, "/usr/bin"); no == nil || !strings.Contains(no.Error(), "SEEDS") {
		t.Errorf("a name outside the patterns: %v", no)
	}
	if !strings.Contains(owner.Describe(), "env may set only tuning variables and WANDB_*,SEED") {
		t.Errorf("describe: %s", owner.Describe())
	}
	for _, bad := range []string{"", "A=B", "[", "a b"} {
		if _, err := New([]string{"acme.*"}, SourceNone, nil, []string{bad}); err == nil || !strings.Contains(err.Error(), "--allow-env") {
			t.Errorf("--allow-env %q: %v", bad, err)
		}
	}
	if w := owner.EnvWarnings(); len(w) != 0 {
		t.Errorf("warnings for WANDB_*: %v", w)
	}
	wide, _ := New([]string{"acme.*"}, SourceNone, nil, []string{"*", "GIT_*"})
	if w := wide.EnvWarnings(); len(w) != 2 || !strings.Contains(w[0], "--allow-env * lets a call set LD_PRELOAD") || !strings.Contains(w[1], "GIT_CONFIG") {
		t.Errorf("warnings for * and GIT_*: %v", w)
	}
	// Without a code policy, every env runs as before.
	off, _ := New(nil, SourceAny, nil, nil)
	if no := off.CheckEnv([]string{"OPENSSL_CONF=/tmp/x", "BASH_FUNC_echo%%=() { id; }"}, "/usr/bin"); no != nil {
		t.Errorf("env refused without a code policy: %v", no)
	}
}

// TestTuningIsDocumented: each variable a call may set under any code
// policy is in docs/security.md's table of why it only tunes.
func TestTuningIsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "| variable | why it only tunes |")
	if i < 0 {
		t.Fatal("docs/security.md has no table of the tuning variables")
	}
	table := readme[i : i+strings.Index(readme[i:], "\n\n")]
	for _, v := range Tuning {
		if !strings.Contains(table, "`"+v.Name+"`") {
			t.Errorf("docs/security.md's table of tuning variables does not name %s (%s)", v.Name, v.Why)
		}
	}
}

// The policy in status, check and the start's log reads as a sentence.
func TestPolicyDescribedPlainly(t *testing.T) {
	for _, tc := range []struct {
		modules []string
		source  string
		want    string
	}{
		{nil, "", "off: any module and any shipped source run"},
		{[]string{"acme.*"}, SourceNone, "on: runs modules acme.* only and no shipped source; a call's env may set only tuning variables"},
		{[]string{ModulesAny}, SourceNone, "on: runs any installed module and no shipped source;"},
		{[]string{"acme.train"}, SourceAny, "on: runs modules acme.train only and any shipped source;"},
	} {
		p, err := New(tc.modules, tc.source, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Describe(); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%v, %q: %q; want it to begin %q", tc.modules, tc.source, got, tc.want)
		}
	}
}

// A refusal never suggests allowing what the README says a policy keeps
// out (os, subprocess): it suggests a module of the owner's own; another
// module is suggested by its own top-level name.
func TestModuleRefusalSuggestsWhatToAllow(t *testing.T) {
	for _, modules := range [][]string{{"acme_pipelines.*"}, nil} {
		source := SourceNone
		if modules == nil {
			source = SourceAny // a policy of no module: --allow-module none
			modules = []string{ModulesNone}
		}
		p, err := New(modules, source, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, mod := range []string{"os", "os.path", "subprocess"} {
			no := p.CheckNode(nodeOf(t, `{"module": "`+mod+`"}`))
			if no == nil || strings.Contains(no.Change, "--allow-module os") || strings.Contains(no.Change, "--allow-module subprocess") ||
				!strings.Contains(no.Change, "keeps out") || !strings.Contains(no.Change, "a module of your own") {
				t.Errorf("%v, module %s: %v; want no suggestion to allow it, and a module of the owner's own", modules, mod, no)
			}
		}
		no := p.CheckNode(nodeOf(t, `{"module": "vision_tools.resize"}`))
		if no == nil || !strings.Contains(no.Change, "vision_tools.*") {
			t.Errorf("%v, module vision_tools.resize: %v; want it to suggest vision_tools.*", modules, no)
		}
	}
	// What the owner allows runs, standard library or not.
	p, _ := New([]string{ModulesAny}, SourceNone, nil, nil)
	if no := p.CheckNode(nodeOf(t, `{"module": "os"}`)); no != nil {
		t.Errorf("--allow-module * refused os: %v", no)
	}
}

// A refused signature says what each side can do, once: source signed
// with a key this worker does not trust tells the author to sign with a
// trusted key and the owner how to trust that key; an expired signature
// says to sign again, once.
func TestSignedRefusalSaysWhatToDoOnce(t *testing.T) {
	key, other := newKey(t, "k"), newKey(t, "o")
	p, err := New([]string{ModulesNone}, SourceSigned, []string{key + PublicKeySuffix}, nil)
	if err != nil {
		t.Fatal(err)
	}
	node := func(src string) Node {
		b, _ := json.Marshal(map[string]string{"source": src, "filename": "train.py"})
		return nodeOf(t, string(b))
	}
	no := p.CheckNode(node(signWith(t, other, nodeSource, time.Time{})))
	if no == nil || !strings.Contains(no.Change, "fluksio-worker sign --key KEY train.py") ||
		!strings.Contains(no.Change, ".pub") || !strings.Contains(no.Change, "--trust-key") || !strings.Contains(no.Change, "reload") {
		t.Errorf("source of an untrusted key: %v; want what the author and the owner can do", no)
	}
	no = p.CheckNode(node(signWith(t, key, nodeSource, time.Now().Add(-time.Minute))))
	if no == nil || !strings.Contains(no.Error(), "expired at") || strings.Count(strings.ToLower(no.Error()), "sign the file") != 1 {
		t.Errorf("expired source: %v; want it said expired and to sign again once", no)
	}
}
