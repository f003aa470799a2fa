package platform

import "testing"

func TestRemapCUDA(t *testing.T) {
	tests := []struct {
		mask, requested, want string
	}{
		{"2,3", "0", "2"},
		{"2,3", "1", "3"},
		{"2,3", "1,0", "3,2"},
		{"2,3", "0,1", "2,3"},
		// Not a position in the mask: passed on as it is.
		{"2,3", "7", "7"},
		{"2,3", "2", "2"},
		// -1 hides every GPU from CUDA; it must not become Python's
		// "last element" of the mask.
		{"2,3", "-1", "-1"},
		{"2,3", "a", "a"},
		{"2,3", "GPU-5d3c0a5e-0000-0000-0000-000000000000", "GPU-5d3c0a5e-0000-0000-0000-000000000000"},
		// Blanks are dropped and spaces trimmed, in both lists.
		{"2,3", " 1 , ,0,", "3,2"},
		{" 2 , ,3 ", "1", "3"},
		{"2,,3", "1", "3"},
		{"2,3", "", ""},
		{"2,3", " , ", ""},
		// Scheduler masks are often UUIDs; positions still map.
		{"GPU-aaa,GPU-bbb", "1", "GPU-bbb"},
		{"5", "0,1", "5,1"},
	}
	for _, tt := range tests {
		if got := RemapCUDA(tt.mask, tt.requested); got != tt.want {
			t.Errorf("RemapCUDA(%q, %q) = %q, want %q", tt.mask, tt.requested, got, tt.want)
		}
	}
}
