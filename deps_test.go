package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryHasNoTestPackages keeps the test harness out of what ships:
// nothing under test/ (the systemd rig, the integration tests' helpers)
// and not the fake runner (agent/runner/runnertest) may be compiled into
// fluksio-worker. The fake engine that selftest uses is agent/enginetest, a
// deliberate package.
func TestBinaryHasNoTestPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps .: %v", err)
	}
	const testTree = "github.com/fluksio/fluksio-worker/test"
	const fakeRunner = "github.com/fluksio/fluksio-worker/agent/runner/runnertest"
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == testTree || strings.HasPrefix(pkg, testTree+"/") {
			t.Errorf("the binary imports %s; code under test/ must not ship", pkg)
		}
		if pkg == fakeRunner {
			t.Errorf("the binary imports the fake runner %s", pkg)
		}
	}
}

// TestProtocolKnowsNotTheMachine keeps the wire package a wire package:
// agent/protocol says what hello carries (its Inventory), and the agent
// fills it from platform, which protocol must not import.
func TestProtocolKnowsNotTheMachine(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./agent/protocol").Output()
	if err != nil {
		t.Fatalf("go list -deps ./agent/protocol: %v", err)
	}
	const platform = "github.com/fluksio/fluksio-worker/platform"
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == platform || strings.HasPrefix(pkg, platform+"/") {
			t.Errorf("agent/protocol imports %s; the agent converts platform's values into protocol's", pkg)
		}
	}
}
