package runner

import (
	"os"
	"path/filepath"
	"strings"
)

// partialArtifactPrefixes name what the runtime writes in the artifact
// cache (<state-dir>/artifacts/sha256) and the code cache
// (<state-dir>/artifacts/code) before renaming it into place, and the trees
// it moves aside before removing them (worker_main.py): a call killed
// outright mid-write leaves them behind.
var partialArtifactPrefixes = []string{".part-", ".unpack-", ".pack-", ".stamp-", ".stale-"}

// cacheDirs are the runtime's caches in the state directory.
var cacheDirs = []string{filepath.Join("artifacts", "sha256"), filepath.Join("artifacts", "code")}

// ClearLeftovers removes what calls of a previous worker with this state
// directory left when it was killed outright (SIGKILL, the OOM killer, a
// watchdog): the calls' directories with whatever the nodes wrote there,
// and partial artifacts and code-cache entries. Only the holder of the state directory's lock may
// call it: with the lock held, nothing else uses these. It returns how many
// it removed.
func ClearLeftovers(stateDir string) (int, error) {
	var left []string
	calls, err := os.ReadDir(filepath.Join(stateDir, callDirsName))
	if err != nil && !os.IsNotExist(err) {
		return 0, err
	}
	for _, e := range calls {
		left = append(left, filepath.Join(stateDir, callDirsName, e.Name()))
	}
	for _, dir := range cacheDirs {
		cacheDir := filepath.Join(stateDir, dir)
		cache, _ := os.ReadDir(cacheDir)
		for _, e := range cache {
			for _, p := range partialArtifactPrefixes {
				if strings.HasPrefix(e.Name(), p) {
					left = append(left, filepath.Join(cacheDir, e.Name()))
				}
			}
		}
	}
	removed := 0
	for _, path := range left {
		d := &callDir{path: path}
		if err := d.remove(); err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}
