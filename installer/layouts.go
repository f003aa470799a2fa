package installer

// LinuxLayouts are where a system service and a user service live on
// Linux, with the user's home written as ~, for the manual page.
func LinuxLayouts() (system, user Layout) {
	system, _ = layoutFor("linux", false, dirs{})
	user, _ = layoutFor("linux", true, dirs{Home: "~"})
	return system, user
}
