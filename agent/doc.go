// Package agent is the worker itself: the configuration, the session with
// the engine (protocol 2 over one WebSocket), and the lifecycle of each call
// in its runner process.
package agent
