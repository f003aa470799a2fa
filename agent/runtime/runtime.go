// Package runtime owns the runner script each call's Python process
// executes: the Python runtime in this directory (worker_main.py, standard
// library only, embedded in the binary), the engine's own runner when it
// serves one, and the private cache in the state directory where either is
// written once per content hash and verified before use.
package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/platform"
)

// embeddedRuntime is the runner each call's Python process executes unless
// the engine serves its own: standard library only, so it runs on whatever
// interpreter the user's nodes need.
//
//go:embed worker_main.py
var embeddedRuntime []byte

// Example is the node file the self-test runs: the same example users
// read in agent/runtime/examples.
//
//go:embed examples/train.py
var Example string

// maxServedRuntime bounds what the engine may serve as a runner script.
const maxServedRuntime = 16 << 20

// runtimeFetchTimeout bounds asking the engine for its runner; a slow engine
// must not delay attaching, the embedded runner is always there.
const runtimeFetchTimeout = 15 * time.Second

// Script is the runner script a call's Python executes.
type Script struct {
	Path   string // on disk, named by content hash
	Hash   string // sha256 hex of the content
	Source string // "engine", "embedded" or "file"
	// Bytecode is the embedded runtime compiled for the interpreter
	// (WithBytecode), what its runners are started from; empty where it
	// could not be had. CompiledBy is the interpreter's file as it was
	// when it compiled it.
	Bytecode   string
	CompiledBy os.FileInfo
}

// Ensure resolves --runtime: a file path is used as it is;
// "embedded" writes the built-in runner to the state directory (once per
// content hash); "auto" first asks the engine for its runner and caches
// what it serves, falling back to the built-in one.
func Ensure(ctx context.Context, cfg config.Config, stateDir string, log *slog.Logger) (Script, error) {
	switch cfg.Runtime {
	case "", "auto":
		if cfg.Policy.On() {
			// A runner the engine serves is code the engine chose: with a
			// code policy, the runner is the embedded one or a local file.
			policyOnce.Do(func() { log.Info("a code policy is on: using the embedded runner, not one the engine serves") })
			return cacheRuntime(stateDir, embeddedRuntime, "embedded")
		}
		body, err := fetchRuntime(ctx, cfg)
		switch {
		case err == nil:
			return cacheRuntime(stateDir, body, "engine")
		case errors.Is(err, errNoServedRuntime):
			// Normal for most engines: said once, not on every attach.
			notServedOnce.Do(func() {
				log.Info("the engine serves no runner; using the embedded one", "url", logging.ShownURL(runtimeURL(cfg)))
			})
		case errors.Is(err, errNoAnswer):
			// The attach that follows fails the same way, and says so.
			log.Debug("could not ask the engine for its runner", "error", err)
		default:
			log.Warn("could not fetch the engine's runner; using the embedded one", "error", err)
		}
		return cacheRuntime(stateDir, embeddedRuntime, "embedded")
	case "embedded":
		return cacheRuntime(stateDir, embeddedRuntime, "embedded")
	default:
		path, err := filepath.Abs(cfg.Runtime)
		if err == nil {
			var b []byte
			if b, err = os.ReadFile(path); err == nil {
				sum := sha256.Sum256(b)
				return Script{Path: path, Hash: hex.EncodeToString(sum[:]), Source: "file"}, nil
			}
		}
		return Script{}, &config.UsageError{Err: fmt.Errorf("--runtime %s: %w (use auto, embedded or a readable file)", cfg.Runtime, err)}
	}
}

var errNoServedRuntime = errors.New("the engine serves no runner")

// errNoAnswer is a fetch that got no answer: the engine could not be
// reached, which the attach after it reports.
var errNoAnswer = errors.New("no answer")

// notServedOnce says once per process that the engine serves no runner;
// policyOnce, that a code policy keeps the engine's runner out.
var notServedOnce, policyOnce sync.Once

// runtimeURL is where the engine serves its runner, beside the socket.
func runtimeURL(cfg config.Config) string { return config.HTTPBase(cfg.URL, "/workers/runtime") }

func fetchRuntime(ctx context.Context, cfg config.Config) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, runtimeFetchTimeout)
	defer cancel()
	url := runtimeURL(cfg)
	shown := logging.ShownURL(url)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	client := http.DefaultClient
	if tlsConfig, err := cfg.TLSConfig(); err != nil {
		return nil, err
	} else if tlsConfig != nil {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.TLSClientConfig = tlsConfig
		client = &http.Client{Transport: transport}
	}
	resp, err := client.Do(req)
	if err != nil {
		// A *url.Error quotes the URL, which carries no token here, but the
		// text is scrubbed all the same where it is logged.
		return nil, fmt.Errorf("%w: %w", errNoAnswer, config.ExplainTLSError(err))
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented,
		// An engine that serves the socket alone at that path, or
		// answers whatever is not the socket with its login.
		http.StatusUpgradeRequired, http.StatusUnauthorized:
		return nil, errNoServedRuntime
	default:
		return nil, fmt.Errorf("GET %s: %s", shown, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxServedRuntime+1))
	if err != nil {
		return nil, err
	}
	if len(body) == 0 || len(body) > maxServedRuntime {
		return nil, fmt.Errorf("GET %s: served %d bytes, expected 1 byte to 16 MiB", shown, len(body))
	}
	return body, nil
}

// cacheRuntime writes content to <state>/runtime/<sha256>.py, and returns
// it for calls to execute only once the file there holds exactly those
// bytes: a file of that name that holds anything else (a planted script of
// the same size, a half-written one) is replaced atomically. The directory
// is private (checkPrivateDir), so the bytes checked are the bytes run.
func cacheRuntime(stateDir string, content []byte, source string) (Script, error) {
	sum := sha256.Sum256(content)
	hash := hex.EncodeToString(sum[:])
	dir := filepath.Join(stateDir, "runtime")
	path := filepath.Join(dir, hash+".py")
	rt := Script{Path: path, Hash: hash, Source: source}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return rt, config.Usagef("cannot create the state directory %s: %v (set --state-dir to a writable directory)", stateDir, err)
	}
	if err := config.PrivateSubdir(dir); err != nil {
		return rt, err
	}
	if cachedRuntimeOK(path, content) {
		return rt, nil
	}
	if err := platform.WriteFileAtomic(path, content, 0o600, platform.KeepOwner); err != nil {
		return rt, fmt.Errorf("cannot write the runner script: %w (set --state-dir to a writable directory with free space)", err)
	}
	return rt, nil
}

// cachedRuntimeOK reports whether path is a plain file of this user's that
// only this user may write, holding exactly content.
func cachedRuntimeOK(path string, content []byte) bool {
	st, err := os.Lstat(path)
	if err != nil || !ownedPrivately(st) || st.Size() != int64(len(content)) {
		return false
	}
	have, err := os.ReadFile(path)
	return err == nil && bytes.Equal(have, content)
}

// ownedPrivately reports whether st is a plain file of this user's that
// only this user may write.
func ownedPrivately(st os.FileInfo) bool {
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o022 != 0 {
		return false
	}
	owner, ok := config.FileOwner(st)
	return !ok || owner == os.Geteuid()
}

// EmbeddedHash is the sha256, in hex, of the runner embedded in this
// binary.
func EmbeddedHash() string {
	sum := sha256.Sum256(embeddedRuntime)
	return hex.EncodeToString(sum[:])
}
