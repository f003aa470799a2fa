package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// checkItems runs check --json against an engine that takes its token,
// with args added, and returns each item's "result: detail".
func checkItems(t *testing.T, args ...string) map[string]string {
	t.Helper()
	const token = "check-items-token-5d0e11"
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{token}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	var out, errs bytes.Buffer
	check(context.Background(), testHost(t, 1000), append([]string{"--url", eng.AttachURL(), "--token", token, "--python", "/usr/bin/python3",
		"--state-dir", t.TempDir(), "--json"}, args...), &out, &errs)
	var report struct {
		Items []struct{ Item, Result, Detail string }
	}
	if err := json.Unmarshal(out.Bytes(), &report); err != nil {
		t.Fatalf("check --json: %v\n%s%s", err, out.String(), errs.String())
	}
	got := map[string]string{}
	for _, it := range report.Items {
		got[it.Item] = it.Result + ": " + it.Detail
	}
	return got
}

// TestCheckSaysLimitsAndDisk: check's limits item fails where the limits
// cannot be had (no cgroup per call), saying what to do, and its disk item
// fails where the state directory's disk has less than --min-free-disk.
func TestCheckSaysLimitsAndDisk(t *testing.T) {
	if !exists("/usr/bin/python3") {
		t.Skip("no /usr/bin/python3")
	}
	got := checkItems(t, "--containment", "subreaper", "--call-pids-max", "64", "--call-memory-max", "2GiB", "--min-free-disk", "1000000GiB")
	if l := got["limits"]; !strings.HasPrefix(l, "fail") || !strings.Contains(l, "memory 2GiB, pids 64") || !strings.Contains(l, "Delegate=yes") {
		t.Errorf("check's limits item without a cgroup per call: %q", l)
	}
	if d := got["disk"]; !strings.HasPrefix(d, "fail") || !strings.Contains(d, "--min-free-disk 1000000GiB") {
		t.Errorf("check's disk item with too little free: %q", d)
	}
	got = checkItems(t, "--containment", "subreaper")
	if l, d := got["limits"], got["disk"]; !strings.HasPrefix(l, "skip") || !strings.HasPrefix(d, "ok") {
		t.Errorf("check without limits, with the default --min-free-disk: limits %q, disk %q", l, d)
	}
}
