package platform

import (
	"strconv"
	"strings"
)

// RemapCUDA turns the device numbers the engine asked for into the ones
// this job may see. The engine counts GPUs from the advertised inventory,
// so it asks for device 0; under a scheduler that already set
// CUDA_VISIBLE_DEVICES=2,3 for this worker, device 0 means the first of
// those, 2. Entries that are not a valid position pass through unchanged.
func RemapCUDA(mask, requested string) string {
	var devices []string
	for _, part := range strings.Split(mask, ",") {
		if part = strings.TrimSpace(part); part != "" {
			devices = append(devices, part)
		}
	}
	var out []string
	for _, part := range strings.Split(requested, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if i, err := strconv.Atoi(part); err == nil && i >= 0 && i < len(devices) {
			out = append(out, devices[i])
		} else {
			out = append(out, part)
		}
	}
	return strings.Join(out, ",")
}
