package policy

import (
	"encoding/json"
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
	p, err := New(nil, "", nil)
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
	p, err := New([]string{"acme_pipelines.*", "tools.prep"}, SourceAny, nil)
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
	none, _ := New([]string{"acme_pipelines.*"}, SourceNone, nil)
	if no := none.CheckNode(nodeOf(t, `{"module": "acme_pipelines.x", "source": "import os"}`)); no == nil || no.Rule != "--allow-source none" {
		t.Errorf("source beside an allowed module: %v", no)
	}
	nomods, _ := New([]string{"none"}, SourceAny, nil)
	if no := nomods.CheckNode(nodeOf(t, `{"module": "none"}`)); no == nil {
		t.Error("--allow-module none allowed a module")
	}
	if _, err := New([]string{"a/b"}, SourceAny, nil); err == nil {
		t.Error("a pattern that names no module was accepted")
	}
}

func TestPolicySignedSourceRule(t *testing.T) {
	key, other := newKey(t, "k"), newKey(t, "o")
	if _, err := New(nil, SourceSigned, nil); err == nil || !strings.Contains(err.Error(), "--trust-key") {
		t.Errorf("signed without keys: %v", err)
	}
	p, err := New(nil, SourceSigned, []string{key + PublicKeySuffix})
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
	if _, err := New(nil, SourceNone, nil); err == nil || !strings.Contains(err.Error(), "lets nothing run") {
		t.Errorf("--allow-source none alone: %v", err)
	}
	if !strings.Contains(p.Describe(), "source signed by key") || !strings.HasPrefix(p.Describe(), "on: runs no installed module and shipped source signed by key ") {
		t.Errorf("describe: %s", p.Describe())
	}
}

func TestPolicyRefusesEnvSideDoors(t *testing.T) {
	p, _ := New([]string{"acme.*"}, SourceNone, nil)
	for _, kv := range []string{"LD_PRELOAD=/tmp/evil.so", "LD_LIBRARY_PATH=/tmp", "PYTHONPATH=/tmp", "PYTHONSTARTUP=/tmp/x.py",
		"PYTHONHOME=/tmp", "PYTHONINSPECT=1", "PYTHONUSERBASE=/tmp", "PYTHONSAFEPATH=", "PYTHONBREAKPOINT=os.system",
		"PATH=/tmp:/usr/bin", "BASH_ENV=/tmp/x", "GCONV_PATH=/tmp"} {
		no := p.CheckEnv([]string{"SEED=1", kv}, "/usr/bin")
		key, _, _ := strings.Cut(kv, "=")
		if no == nil || !strings.Contains(no.Error(), key) {
			t.Errorf("%s: %v", kv, no)
		}
	}
	for _, kv := range []string{"PATH=/usr/bin", "PYTHONUNBUFFERED=1", "CUDA_VISIBLE_DEVICES=0", "OMP_NUM_THREADS=4"} {
		if no := p.CheckEnv([]string{kv}, "/usr/bin"); no != nil {
			t.Errorf("%s refused: %v", kv, no)
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
		{[]string{"acme.*"}, SourceNone, "on: runs modules acme.* only and no shipped source; a call's env may not load code"},
		{[]string{ModulesAny}, SourceNone, "on: runs any installed module and no shipped source;"},
		{[]string{"acme.train"}, SourceAny, "on: runs modules acme.train only and any shipped source;"},
	} {
		p, err := New(tc.modules, tc.source, nil)
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
		p, err := New(modules, source, nil)
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
	p, _ := New([]string{ModulesAny}, SourceNone, nil)
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
	p, err := New([]string{ModulesNone}, SourceSigned, []string{key + PublicKeySuffix})
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
