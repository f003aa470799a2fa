package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// An engine that accepts the resume extension and then never answers the
// worker's resume message: once the wait for its answer runs out (30 s,
// one second here), the held calls are stopped and the log says why.
func TestHeldCallsStopWhenTheEngineNeverAnswersResume(t *testing.T) {
	t.Parallel()
	f := serveFakeWith(t, enginetest.Options{Resume: 10 * time.Minute},
		func(a *agent.Agent) { a.SetResumeWait(time.Second) })
	c := f.run(t, "held", map[string]any{"announce": true}, map[string]any{"sleep_ms": 600000})
	pid := started(t, c)

	f.eng.IgnoreResume()
	if err := f.eng.Restart(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	f.wk = f.attach(t)
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	msg, err := f.wk.Resumed(ctx)
	if err != nil {
		t.Fatalf("no resume message: %v", err)
	}
	if len(msg.Calls) != 1 || msg.Calls[0].CallID != "held" {
		t.Fatalf("the worker says it holds %+v; want the call held", msg.Calls)
	}
	eventually(t, goneTimeout, "the held call's runner to be stopped", func() bool { return !platform.ProcessAlive(pid) })
	if !strings.Contains(f.log.String(), "did not answer the resume message") {
		t.Errorf("the log does not say the engine did not answer")
	}
	if answer := answerOf(t, f.run(t, "after")); !answer.OK {
		t.Errorf("a call after the unanswered resume answered %s", answer.Raw)
	}
}
