package runner

import (
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// runtimeConstants reads the top-level constants of the embedded runtime
// (the file go:embed takes into the binary) as Go values: strings (str and
// bytes literals), numbers, and tuples of strings (literals, or the names
// of string constants above them).
func runtimeConstants(t *testing.T) map[string]any {
	t.Helper()
	src, err := os.ReadFile("../runtime/worker_main.py")
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]any{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z][A-Z0-9_]*) = (.+)$`).FindAllStringSubmatch(string(src), -1) {
		name, lit := m[1], strings.TrimSpace(m[2])
		if v, ok := pythonLiteral(lit, consts); ok {
			consts[name] = v
		}
	}
	return consts
}

// pythonLiteral reads the few literal forms the wire's constants use; a
// tuple's item may name a string constant of consts.
func pythonLiteral(lit string, consts map[string]any) (any, bool) {
	if strings.HasPrefix(lit, "(") && strings.HasSuffix(lit, ")") {
		var items []string
		for _, part := range strings.Split(strings.Trim(lit, "()"), ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			s, err := strconv.Unquote(part)
			if named, ok := consts[part].(string); ok && err != nil {
				s, err = named, nil
			}
			if err != nil {
				return nil, false
			}
			items = append(items, s)
		}
		return items, true
	}
	if s, err := strconv.Unquote(strings.TrimPrefix(lit, "b")); err == nil {
		return s, true
	}
	if n, err := strconv.ParseFloat(lit, 64); err == nil {
		return n, true
	}
	return nil, false
}

// Every value the worker and the runtime both hold (wire.go and the block
// "The worker's wire" of worker_main.py) is the same on both sides.
func TestWireMatchesTheRuntime(t *testing.T) {
	py := runtimeConstants(t)
	threads, _ := reflect.TypeFor[spareReport]().FieldByName("Threads")
	twins := []struct {
		name string
		want any
	}{
		{"SPARE_FLAG", spareFlag},
		{"ZYGOTE_FLAG", zygoteFlag},
		{"OUTPUT_FLAG", outputFlag},
		{"OUTPUT_TOKEN_AFTER", float64(outputTokenAfter)},
		{"CAPABILITIES_FLAG", capabilitiesFlag},
		{"MODES", []string{outputFlag, spareFlag, zygoteFlag}},
		{"CAPABILITY_VERSION", jsonKey[runtimeCapabilities]("Version")},
		{"CAPABILITY_MODES", jsonKey[runtimeCapabilities]("Modes")},
		{"SPARE_WATCH", jsonKey[spareReport]("Watch")},
		{"SPARE_FAILED", jsonKey[spareReport]("Failed")},
		{"SPARE_THREADS", jsonKey[spareReport]("Threads")},
		{"SPARE_THREADS_COUNT", jsonKeyOf(threads.Type.Elem(), "Count")},
		{"SPARE_THREADS_MODULE", jsonKeyOf(threads.Type.Elem(), "Module")},
		{"SPARE_NO_FORKS", jsonKey[spareReport]("NoForks")},
		{"FORK_ENV", jsonKey[forkRequest]("Env")},
		{"FORK_CWD", jsonKey[forkRequest]("Cwd")},
		{"FORK_TOKEN", jsonKey[forkRequest]("Token")},
		{"FORK_REQUEST_KEYS", jsonKeys[forkRequest]()},
		{"FORK_FDS", float64(forkFDs)},
		{"FORKED_OUTPUT_FD", float64(forkedOutputFD)},
		{"FORK_FAILED", strconv.Itoa(0)},
		{"EXIT_RECORD_SIZE", float64(exitRecordSize)},
		{"MARK_PREFIX", markPrefix},
		{"MARK_SUFFIX", markSuffix},
		{"MARK_TOKEN_SIZE", float64(markTokenSize)},
		{"LOG_BURST", float64(logBurst)},
		{"LOG_RATE", float64(logRate)},
		{"LOG_TAIL", float64(logTail)},
		{"LOG_LINE_MAX", float64(nodeLineMax)},
		{"CALL_DIR_ENV", callDirEnv},
		{"CANCEL_GRACE_ENV", cancelGraceEnv},
		{"ARTIFACT_URL_ENV", ArtifactURLEnv},
		{"ARTIFACT_TOKEN_ENV", ArtifactTokenEnv},
		{"ARTIFACT_CACHE_ENV", ArtifactCacheEnv},
		{"SANDBOX_FORKS_ENV", sandboxForksEnv},
		{"PIN_FORKS_ENV", pinForksEnv},
	}
	for _, tw := range twins {
		got, ok := py[tw.name]
		if !ok {
			t.Errorf("worker_main.py has no constant %s (wire.go has %v)", tw.name, tw.want)
			continue
		}
		if !reflect.DeepEqual(got, tw.want) {
			t.Errorf("worker_main.py's %s is %#v; wire.go has %#v", tw.name, got, tw.want)
		}
	}
	// The exit record as zygote_exits.go reads it: a signed 32-bit pid, a
	// 32-bit wait status, a 64-bit peak, in native order without padding
	// (struct's "=": native order, standard sizes).
	format, _ := py["EXIT_RECORD_FORMAT"].(string)
	if format != "=iIQ" {
		t.Errorf("worker_main.py's EXIT_RECORD_FORMAT is %q; zygote_exits.go reads \"=iIQ\" (pid int32, status uint32, peak uint64)", format)
	}
	size := 0
	for _, c := range strings.TrimPrefix(format, "=") {
		size += map[rune]int{'i': 4, 'I': 4, 'q': 8, 'Q': 8}[c]
	}
	if size != exitRecordSize {
		t.Errorf("worker_main.py's exit record (%q) takes %d bytes; exitRecordSize is %d", format, size, exitRecordSize)
	}
	np, err := newNodePipes()
	if err != nil {
		t.Fatal(err)
	}
	defer np.close()
	if len(np.token) != markTokenSize {
		t.Errorf("a runner's token has %d hex digits; markTokenSize is %d", len(np.token), markTokenSize)
	}
}

// jsonKey is the JSON key of T's field named field.
func jsonKey[T any](field string) string { return jsonKeyOf(reflect.TypeFor[T](), field) }

func jsonKeyOf(t reflect.Type, field string) string {
	f, ok := t.FieldByName(field)
	if !ok {
		panic(t.String() + " has no field " + field)
	}
	return strings.Split(f.Tag.Get("json"), ",")[0]
}

// jsonKeys is every JSON key of T, in the order of its fields.
func jsonKeys[T any]() []string {
	t := reflect.TypeFor[T]()
	var keys []string
	for i := range t.NumField() {
		keys = append(keys, jsonKeyOf(t, t.Field(i).Name))
	}
	return keys
}
