package agent

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// pythonStr must give what the reference agent's str(value) gives for the
// decoded JSON value, since that is what the runner's environment held.
// The expectations are Python 3's own output.
func TestPythonStr(t *testing.T) {
	tests := []struct{ raw, want string }{
		{`"x"`, "x"},
		{`""`, ""},
		{`"with \"quotes\" and \u00e9"`, `with "quotes" and é`},
		{`4`, "4"},
		{`-7`, "-7"},
		{`0`, "0"},
		{`true`, "True"},
		{`false`, "False"},
		{`null`, "None"},
		{`1.5`, "1.5"},
		{`0.1`, "0.1"},
		{`100.0`, "100.0"},
		{`1E2`, "100.0"},
		{`2.50`, "2.5"},
		{`0.0001`, "0.0001"},
		{`1e-05`, "1e-05"},
		{`1.5e-7`, "1.5e-07"},
		{`1e16`, "1e+16"},
		{`1e22`, "1e+22"},
		{`-0.0`, "-0.0"},
		// Python prints floats below 1e16 in full; Go's %g switches to an
		// exponent at 1e21 only with a precision, at 1e6 by default.
		{`1000000.0`, "1000000.0"},
		{`1234567.5`, "1234567.5"},
		{`1e15`, "1000000000000000.0"},
		// Python's ints have no size limit.
		{`18446744073709551616`, "18446744073709551616"},
	}
	for _, tt := range tests {
		if got := pythonStr(json.RawMessage(tt.raw)); got != tt.want {
			t.Errorf("pythonStr(%s) = %q, want %q (Python's str)", tt.raw, got, tt.want)
		}
	}
}

func envValue(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, _ := strings.Cut(env[i], "="); k == key {
			return v, true
		}
	}
	return "", false
}

func TestCallEnvRemapsCUDADevicesUnderAMask(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "2,3")
	a := &Agent{baseEnv: []string{"PATH=/usr/bin"}}
	tests := []struct{ requested, want string }{
		{`"0"`, "2"},
		{`"1,0"`, "3,2"},
		{`1`, "3"},
		{`"7"`, "7"},
		{`"-1"`, "-1"},
		{`""`, ""},
	}
	for _, tt := range tests {
		env, err := a.callEnv(json.RawMessage(`{"CUDA_VISIBLE_DEVICES": ` + tt.requested + `}`))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := envValue(env, "CUDA_VISIBLE_DEVICES"); got != tt.want {
			t.Errorf("mask 2,3, requested %s: runner gets CUDA_VISIBLE_DEVICES=%q, want %q", tt.requested, got, tt.want)
		}
	}
}

func TestCallEnvWithoutAMaskPassesDevicesAsAsked(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	a := &Agent{baseEnv: []string{"PATH=/usr/bin"}}
	env, err := a.callEnv(json.RawMessage(`{"CUDA_VISIBLE_DEVICES": "1,0"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := envValue(env, "CUDA_VISIBLE_DEVICES"); got != "1,0" {
		t.Errorf("no mask: CUDA_VISIBLE_DEVICES=%q, want 1,0", got)
	}
}

// The request's env wins over the agent's own for the process that runs,
// and one call's env never leaks into another's.
func TestCallEnvReachesTheProcess(t *testing.T) {
	envBin, err := exec.LookPath("env")
	if err != nil {
		t.Skip("no env binary")
	}
	a := &Agent{baseEnv: []string{"OMP_NUM_THREADS=64", "KEEP=yes"}}
	first, err := a.callEnv(json.RawMessage(`{"OMP_NUM_THREADS": 4, "ONLY_FIRST": "1"}`))
	if err != nil {
		t.Fatal(err)
	}
	second, err := a.callEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	run := func(env []string) string {
		cmd := exec.Command(envBin)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return "\n" + string(out)
	}
	out := run(first)
	if !strings.Contains(out, "\nOMP_NUM_THREADS=4\n") || strings.Contains(out, "OMP_NUM_THREADS=64") || !strings.Contains(out, "\nKEEP=yes\n") {
		t.Errorf("the runner's environment:%s\nwant OMP_NUM_THREADS=4 (the request's) and KEEP=yes", out)
	}
	if out := run(second); strings.Contains(out, "ONLY_FIRST") || !strings.Contains(out, "\nOMP_NUM_THREADS=64\n") {
		t.Errorf("a later call's environment:%s\nwant the agent's own, without the first call's", out)
	}
	if _, err := a.callEnv(json.RawMessage(`["A=1"]`)); err == nil {
		t.Error("an env that is not an object was accepted")
	}
}

func TestParseMessage(t *testing.T) {
	tests := []struct {
		data       string
		ok         bool
		op, callID string
	}{
		{`{"op":"run","call_id":"c1"}`, true, "run", "c1"},
		{`{"op":"compile","call_id":7}`, true, "compile", "7"},
		{`{"op":"cancel","call_id":"c1"}`, true, "cancel", "c1"},
		{`{"op":"run","call_id":null}`, true, "run", ""},
		{`{"op":"run"}`, true, "run", ""},
		{`{"op":5,"call_id":"c1"}`, true, "", "c1"},
		{`{"op":"run","call_id":{"a":1}}`, true, "run", ""},
		{`{}`, true, "", ""},
		{`null`, false, "", ""},
		{`[]`, false, "", ""},
		{`"run"`, false, "", ""},
		{`not json`, false, "", ""},
		{``, false, "", ""},
	}
	for _, tt := range tests {
		m, err := parseMessage([]byte(tt.data))
		if (err == nil) != tt.ok {
			t.Errorf("parseMessage(%s) error = %v, want ok=%v", tt.data, err, tt.ok)
			continue
		}
		if m.op != tt.op || m.callID != tt.callID {
			t.Errorf("parseMessage(%s) = op %q call_id %q, want %q %q", tt.data, m.op, m.callID, tt.op, tt.callID)
		}
	}
}

func TestRequestLineDropsOnlyEnv(t *testing.T) {
	data := `{"op":"run","call_id":"c1","env":{"CUDA_VISIBLE_DEVICES":"0"},` +
		`"node":{"source":"if a < b and c > d: print('&')\n","filename":"p.py"},` +
		`"function":"train","inputs":{"steps":3,"lr":1.50,"big":123456789012345678901234567890},"settings":{}}`
	m, err := parseMessage([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	line, err := requestLine(m.fields)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(line, []byte("\n")) || bytes.Count(line, []byte("\n")) != 1 {
		t.Fatalf("request line %q is not exactly one line", line)
	}
	if !json.Valid(line) {
		t.Fatalf("request line is not JSON: %s", line)
	}
	var got map[string]json.RawMessage
	json.Unmarshal(line, &got)
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if want := []string{"call_id", "function", "inputs", "node", "op", "settings"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("request keys = %q, want %q (all but env)", keys, want)
	}
	// Source text travels as it is, without \u003c escapes, and numbers as
	// the engine wrote them.
	for _, want := range []string{`a < b and c > d: print('&')`, `"lr":1.50`, `123456789012345678901234567890`} {
		if !bytes.Contains(line, []byte(want)) {
			t.Errorf("request line lost %q: %s", want, line)
		}
	}
}
