package protocol

import (
	"encoding/json"
	"testing"
	"time"
)

// Only a welcome that says version 1 with a positive grace accepts the
// extension; anything else leaves the connection plain protocol 2.
func TestResumeGrace(t *testing.T) {
	for welcome, want := range map[string]time.Duration{
		`{"op":"welcome","name":"w"}`:                                    0,
		`{"op":"welcome","resume":{"version":1,"grace":120}}`:            2 * time.Minute,
		`{"op":"welcome","resume":{"version":1,"grace":0.5}}`:            500 * time.Millisecond,
		`{"op":"welcome","resume":{"version":2,"grace":120}}`:            0,
		`{"op":"welcome","resume":{"version":1,"grace":0}}`:              0,
		`{"op":"welcome","resume":{"version":1,"grace":-5}}`:             0,
		`{"op":"welcome","resume":{"version":1,"grace":"120"}}`:          0,
		`{"op":"welcome","resume":true}`:                                 0,
		`{"op":"welcome","resume":null}`:                                 0,
		`{"op":"welcome","resume":{"version":1,"grace":1e300}}`:          7 * 24 * time.Hour,
		`{"op":"welcome","resume":{"version":1,"grace":120,"extra":[]}}`: 2 * time.Minute,
	} {
		if got := ResumeGrace([]byte(welcome)); got != want {
			t.Errorf("ResumeGrace(%s) = %s, want %s", welcome, got, want)
		}
	}
}

func TestResumeOffer(t *testing.T) {
	// Whole seconds, rounded up: a grace under a second is still an offer
	// an engine can accept (grace=0 is none).
	for grace, want := range map[time.Duration]string{
		5 * time.Minute:        "1; grace=300",
		500 * time.Millisecond: "1; grace=1",
		90*time.Second + 1:     "1; grace=91",
		time.Second:            "1; grace=1",
	} {
		if got := ResumeOffer(grace); got != want {
			t.Errorf("ResumeOffer(%s) = %q, want %q", grace, got, want)
		}
	}
	for header, want := range map[string]time.Duration{
		"1; grace=300": 5 * time.Minute,
		"1;grace=7":    7 * time.Second,
		"2; grace=300": 0,
		"1":            0,
		"1; grace=0":   0,
		"1; grace=x":   0,
		"":             0,
	} {
		got, ok := ParseResumeOffer(header)
		if got != want || ok != (want > 0) {
			t.Errorf("ParseResumeOffer(%q) = %s, %v; want %s", header, got, ok, want)
		}
	}
}

// Verdicts without a known action or a call id are left out: those calls
// are unclaimed. Numeric call ids read as Python's str() makes them.
func TestParseResumeAnswer(t *testing.T) {
	var fields map[string]json.RawMessage
	json.Unmarshal([]byte(`{"op":"resume","calls":[
		{"call_id":"a","action":"continue","seq":7},
		{"call_id":"b","action":"cancel"},
		{"call_id":"c","action":"pause"},
		{"action":"continue","seq":1},
		{"call_id":12,"action":"continue","seq":0},
		"junk"]}`), &fields)
	got, err := ParseResumeAnswer(fields)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]ResumeVerdict{
		"a":  {CallID: "a", Action: ResumeContinue, Seq: 7},
		"b":  {CallID: "b", Action: ResumeCancel},
		"12": {CallID: "12", Action: ResumeContinue},
	}
	if len(got) != len(want) {
		t.Fatalf("verdicts %v, want %v", got, want)
	}
	for id, v := range want {
		if got[id] != v {
			t.Errorf("verdict for %s = %+v, want %+v", id, got[id], v)
		}
	}
	var bare map[string]json.RawMessage
	json.Unmarshal([]byte(`{"op":"resume"}`), &bare)
	if _, err := ParseResumeAnswer(bare); err == nil {
		t.Error("an answer without calls was read as one that claims nothing")
	}
}

// Acknowledged answers are asked for with a JSON true in an accepting
// welcome's resume object, and nowhere else.
func TestResumeAck(t *testing.T) {
	for welcome, want := range map[string]bool{
		`{"op":"welcome","resume":{"version":1,"grace":60,"ack":true}}`:   true,
		`{"op":"welcome","resume":{"version":1,"grace":60}}`:              false,
		`{"op":"welcome","resume":{"version":1,"grace":60,"ack":false}}`:  false,
		`{"op":"welcome","resume":{"version":1,"grace":60,"ack":"true"}}`: false,
		`{"op":"welcome","resume":{"version":1,"grace":60,"ack":1}}`:      false,
		`{"op":"welcome","resume":{"version":2,"grace":60,"ack":true}}`:   false,
		`{"op":"welcome","resume":{"version":1,"ack":true}}`:              false,
		`{"op":"welcome","ack":true}`:                                     false,
	} {
		if got := ResumeAck([]byte(welcome)); got != want {
			t.Errorf("ResumeAck(%s) = %v, want %v", welcome, got, want)
		}
	}
}
