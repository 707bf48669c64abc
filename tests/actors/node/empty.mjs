// A script without process(): the Node host refuses to start with it.
export const nothing = true;
