package agent

// Version is the binary's version, set by main.
var Version = "dev"
