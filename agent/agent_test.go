package agent

import (
	"encoding/json"
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

// A request's CUDA devices are positions in the worker's own mask. (What
// reaches a real runner is TestCallEnvironment's.)
func TestRequestEnvRemapsCUDADevicesUnderAMask(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "2,3")
	tests := []struct{ requested, want string }{
		{`"0"`, "2"},
		{`"1,0"`, "3,2"},
		{`1`, "3"},
		{`"7"`, "7"},
		{`"-1"`, "-1"},
		{`""`, ""},
	}
	for _, tt := range tests {
		env, err := requestEnv(json.RawMessage(`{"CUDA_VISIBLE_DEVICES": ` + tt.requested + `}`))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := envValue(env, "CUDA_VISIBLE_DEVICES"); got != tt.want {
			t.Errorf("mask 2,3, requested %s: runner gets CUDA_VISIBLE_DEVICES=%q, want %q", tt.requested, got, tt.want)
		}
	}
}

func TestRequestEnvWithoutAMaskPassesDevicesAsAsked(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	env, err := requestEnv(json.RawMessage(`{"CUDA_VISIBLE_DEVICES": "1,0"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := envValue(env, "CUDA_VISIBLE_DEVICES"); got != "1,0" {
		t.Errorf("no mask: CUDA_VISIBLE_DEVICES=%q, want 1,0", got)
	}
	if _, err := requestEnv(json.RawMessage(`["A=1"]`)); err == nil {
		t.Error("an env that is not an object was accepted")
	}
}
