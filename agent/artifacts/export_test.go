package artifacts

// Entries lists the cache's entries, the least recently used first, for
// the tests to see what a trim kept.
func (c *Cache) Entries() ([]Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries()
}
