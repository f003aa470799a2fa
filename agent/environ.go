package agent

import (
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/runner"
)

// runnerBaseEnv is the environment every runner starts from, before its
// request's env: the worker's own, less the worker's settings, plus what
// the protocol hands node code (section 2).
//
// FLUKSIO_WORKER_* are the worker's options (the token among them) and mean
// nothing to node code, which gets the token only as
// FLUKSIO_ARTIFACT_TOKEN. FLUKSIO_ARTIFACT_URL and FLUKSIO_ARTIFACT_TOKEN
// are this worker's to set, whatever the environment held.
func runnerBaseEnv(cfg config.Config, stateDir string, environ []string, getenv func(string) string, log *slog.Logger) []string {
	env := make([]string, 0, len(environ)+5)
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, config.EnvPrefix) || name == runner.ArtifactURLEnv || name == runner.ArtifactTokenEnv {
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		runner.ArtifactURLEnv+"="+cfg.ArtifactBase(),
		runner.ArtifactTokenEnv+"="+cfg.Token)
	if getenv(runner.ArtifactCacheEnv) == "" {
		env = append(env, runner.ArtifactCacheEnv+"="+artifactCacheDir(stateDir, getenv))
	}
	if cfg.CAFile != "" {
		caFile, _ := filepath.Abs(cfg.CAFile)
		// FLUKSIO_CA_FILE names the extra authorities alone, for node code
		// that builds its own TLS context.
		env = append(env, "FLUKSIO_CA_FILE="+caFile)
		bundle, err := nodeCABundle(cfg, stateDir, getenv)
		if err != nil {
			log.Warn("node processes trust only --ca-file's authorities: could not write a bundle with the system's", "error", err)
			bundle = caFile
		}
		env = append(env, "SSL_CERT_FILE="+bundle)
	}
	return env
}

// artifactCacheDir is where runners cache the artifacts node code loads
// (FLUKSIO_ARTIFACT_CACHE): the directory the worker's own environment
// names, else one where this worker can surely write (a service may not
// write its account's home), not ~/.cache: the state directory's
// artifacts/, which config.ResolveStateDir made private.
func artifactCacheDir(stateDir string, getenv func(string) string) string {
	if dir := getenv(runner.ArtifactCacheEnv); dir != "" {
		return dir
	}
	return filepath.Join(stateDir, "artifacts")
}
