package installer

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/platform"
)

// configHeader opens every config install writes. Comments a person adds
// below it are not kept by the next install (the file is re-encoded); keys are.
const configHeader = `# fluksio-worker configuration, written by 'fluksio-worker install'.
# Keys are the long options of 'fluksio-worker run --help'. Running install
# again keeps keys it is not told to change, but not comments.
# This file holds the worker token: keep it mode 0600.

`

// Modes of what install writes. The config holds the token, so only its
// owner (the service account) may read it. The system config directory is
// root's, with the service account's group, so the service can read its
// config but not replace it; a user service's directory is the user's alone.
const (
	configFileMode      fs.FileMode = 0o600
	systemConfigDirMode fs.FileMode = 0o750
	userConfigDirMode   fs.FileMode = 0o700
)

// readConfig returns the keys of an existing config, or none if there is no
// file yet.
func readConfig(path string) (map[string]any, error) {
	values, err := config.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]any{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w (fix the file or remove it, then run install again)", err)
	}
	return values, nil
}

// encodeConfig renders the keys as the TOML file install writes.
func encodeConfig(values map[string]any) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(configHeader)
	if err := toml.NewEncoder(&buf).Encode(values); err != nil {
		return nil, fmt.Errorf("encoding the config: %w", err)
	}
	return buf.Bytes(), nil
}

// loadConfig checks the keys the way `run --config` will read them, through
// the agent's own loader, and returns what the service will run with. Only
// these keys count: not the installer's environment.
func loadConfig(values map[string]any) (config.Config, error) {
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var args []string
	for _, k := range keys {
		o, ok := config.OptionByName(k)
		if !ok {
			return config.Config{}, fmt.Errorf("unknown config key %q%s (known keys are the long options of 'fluksio-worker run --help')", k, config.DidYouMean(strings.ReplaceAll(k, "_", "-"), config.OptionNames()))
		}
		err := o.CheckValueType(values[k])
		var text string
		if err == nil {
			text, err = config.ValueText(values[k])
		}
		if err != nil {
			return config.Config{}, fmt.Errorf("config key %s: %w", k, err)
		}
		args = append(args, "--"+o.Name+"="+text)
	}
	noEnv := func(string) string { return "" }
	cfg, err := config.Load(args, noEnv)
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Resolve()
}

// flagValue is what install writes for an option given on its command line:
// labels as a list, whole numbers as numbers (parallel = 2, not "2"), the
// rest as text. `run` reads all of them back the same way.
func flagValue(name, text string) any {
	if name == "labels" {
		return config.SplitLabels(text)
	}
	if o, ok := config.OptionByName(name); ok && o.TakesNumber() {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return n
		}
	}
	return text
}

// owner is who a written file or directory belongs to; -1 keeps what the
// process creating it gets.
// writeConfig replaces the config at path atomically (see platform.WriteFileAtomic)
// as a 0600 file of the given owner, so no reader (the service starting, or
// a person) ever sees half a file, or a token in a file others may read.
// The directory is created with dirMode, its group set to the file platform.Owner's.
func writeConfig(path string, data []byte, file platform.Owner, dirMode fs.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	// MkdirAll leaves an existing directory's mode alone, and the umask
	// trims a new one's.
	if err := os.Chmod(dir, dirMode); err != nil {
		return fmt.Errorf("securing %s: %w", dir, err)
	}
	if file.GID >= 0 {
		if err := os.Chown(dir, -1, file.GID); err != nil {
			return fmt.Errorf("securing %s: %w", dir, err)
		}
	}
	return platform.WriteFileAtomic(path, data, configFileMode, file)
}
