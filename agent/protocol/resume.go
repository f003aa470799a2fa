package protocol

// The resume extension (docs/resume.md): calls
// survive an engine outage when both sides opt in. A protocol-2 engine
// never sees any of this: the offer is an HTTP header on the upgrade, and
// everything else follows only a welcome that accepted it.

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ResumeHeader carries the worker's offer on the WebSocket upgrade:
// "1; grace=SECONDS", the extension's version and the longest outage the
// worker will hold calls through.
const ResumeHeader = "Fluksio-Resume"

// ResumeVersion is the version of the extension this worker speaks.
const ResumeVersion = 1

// OpResume is both the worker's first message after a welcome that accepted
// the extension (the calls it holds) and the engine's answer to it (what to
// do with each).
const OpResume = "resume"

// OpAck is the engine's acknowledgement of a call's answer, on a
// connection whose welcome asked for acknowledged answers: {"op": "ack",
// "call_id": ID}.
const OpAck = "ack"

// Actions in the engine's resume answer.
const (
	ResumeContinue = "continue" // replay after seq, then go on live
	ResumeCancel   = "cancel"   // stop the call and answer it NodeCancelled
)

// ResumeOffer is the header value offering the extension with grace, in
// whole seconds rounded up: a grace under a second is not offered as
// grace=0, which says nothing is held.
func ResumeOffer(grace time.Duration) string {
	return fmt.Sprintf("%d; grace=%d", ResumeVersion, int64((grace+time.Second-1)/time.Second))
}

// ParseResumeOffer reads an offer header: the grace, and whether it is an
// offer of a version this side speaks.
func ParseResumeOffer(v string) (time.Duration, bool) {
	version, params, _ := strings.Cut(v, ";")
	if strings.TrimSpace(version) != strconv.Itoa(ResumeVersion) {
		return 0, false
	}
	for _, p := range strings.Split(params, ";") {
		k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
		if k == "grace" {
			n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil || n <= 0 {
				return 0, false
			}
			return time.Duration(n) * time.Second, true
		}
	}
	return 0, false
}

// WelcomeResume is the welcome's "resume" field: {"version": 1, "grace": S},
// with "ack": true when the engine acknowledges answers.
type WelcomeResume struct {
	Version int     `json:"version"`
	Grace   float64 `json:"grace"`         // seconds the engine keeps a lost worker's calls
	Ack     bool    `json:"ack,omitempty"` // the engine acknowledges answers (OpAck)
}

// ResumeGrace reads a welcome's acceptance of the extension: the grace the
// engine allows, or 0 when the welcome does not accept it (no "resume"
// field, another version, a grace that is not a positive number). Anything
// malformed there is read as no acceptance: the connection then speaks
// plain protocol 2.
func ResumeGrace(welcome []byte) time.Duration {
	var w struct {
		Resume json.RawMessage `json:"resume"`
	}
	if json.Unmarshal(welcome, &w) != nil || len(w.Resume) == 0 {
		return 0
	}
	var r WelcomeResume
	if json.Unmarshal(w.Resume, &r) != nil || r.Version != ResumeVersion || !(r.Grace > 0) {
		return 0
	}
	return time.Duration(min(r.Grace, 7*24*3600) * float64(time.Second))
}

// ResumeAck reads whether a welcome that accepted the extension (ResumeGrace
// above 0) asked for acknowledged answers: "ack": true in its "resume"
// field, a JSON true and nothing else.
func ResumeAck(welcome []byte) bool {
	if ResumeGrace(welcome) == 0 {
		return false
	}
	var w struct {
		Resume struct {
			Ack json.RawMessage `json:"ack"`
		} `json:"resume"`
	}
	return json.Unmarshal(welcome, &w) == nil && string(w.Resume.Ack) == "true"
}

// HeldCall is one call the worker holds, in its resume message.
type HeldCall struct {
	CallID string `json:"call_id"`
	// Seq is the number of the call's last frame (its frames are numbered
	// 1, 2, ... over every connection; heartbeats are not counted).
	Seq int64 `json:"seq"`
	// Done: the call's answer is its frame Seq.
	Done bool `json:"done"`
	// HeldFor is how long the worker has held it, in seconds.
	HeldFor float64 `json:"held_s"`
}

// ResumeHello is the worker's message right after an accepting welcome.
type ResumeHello struct {
	Op    string     `json:"op"`
	Calls []HeldCall `json:"calls"`
}

// ResumeVerdict is the engine's word on one held call.
type ResumeVerdict struct {
	CallID string `json:"call_id"`
	Action string `json:"action"`
	Seq    int64  `json:"seq"` // with continue: the last frame the engine has
}

// ParseResumeAnswer reads the engine's resume answer: verdicts by call id.
// A verdict without a known action is left out (the call is unclaimed).
func ParseResumeAnswer(fields map[string]json.RawMessage) (map[string]ResumeVerdict, error) {
	var calls []json.RawMessage
	if err := json.Unmarshal(fields["calls"], &calls); err != nil {
		return nil, fmt.Errorf("the engine's resume answer has no calls list: %w", err)
	}
	out := make(map[string]ResumeVerdict, len(calls))
	for _, raw := range calls {
		var v struct {
			CallID json.RawMessage `json:"call_id"`
			Action string          `json:"action"`
			Seq    int64           `json:"seq"`
		}
		if json.Unmarshal(raw, &v) != nil {
			continue
		}
		id := CallIDText(v.CallID)
		if id == "" || (v.Action != ResumeContinue && v.Action != ResumeCancel) {
			continue
		}
		out[id] = ResumeVerdict{CallID: id, Action: v.Action, Seq: v.Seq}
	}
	return out, nil
}
