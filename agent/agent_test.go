package agent

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

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
