package agent

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// The runner's environment carries the artifact endpoint and the token.
func TestRunnerEnvironmentHasArtifactEndpoint(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.URL = "wss://h/api/v1/workers/attach"
	cfg.Token = "tok-1"
	a := New(cfg, slog.New(slog.DiscardHandler), "/usr/bin/python3", t.TempDir())
	defer a.status.Flush()
	env, err := a.callEnv([]byte(`{"OMP_NUM_THREADS": 4, "FLAG": true}`))
	if err != nil {
		t.Fatal(err)
	}
	joined := "\n" + strings.Join(env, "\n") + "\n"
	for _, want := range []string{
		"\nFLUKSIO_ARTIFACT_URL=https://h/api/v1/artifacts\n",
		"\nFLUKSIO_ARTIFACT_TOKEN=tok-1\n",
		"\nOMP_NUM_THREADS=4\n",
		"\nFLAG=True\n",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("runner environment lacks %q", strings.TrimSpace(want))
		}
	}
}
